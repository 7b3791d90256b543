"""Running error statistics of (predicted, actual) RTT pairs: small, mergeable, serialisable.

Only sums are kept, never the pairs, so a window's state is a handful of floats whatever its traffic,
two partial windows merge exactly (``a + b`` equals the statistics of both sets of pairs), and the
state round-trips through a plain dict (a Faust table value). With ``e = predicted - actual``:

* ``rmse_ms = sqrt(sum(e²) / n)``, ``mae_ms = sum(|e|) / n``, ``bias_ms = sum(e) / n``
  (positive bias: the model predicts too slow);
* ``mape = sum(|e| / actual) / n_pct`` over the pairs with ``actual >= 1 µs`` (a fraction, 0.1 = 10 %;
  a shorter RTT is no basis for a percentage);
* ``mean_actual_ms = sum(actual) / n``, and ``relative_rmse = rmse_ms / mean_actual_ms``.

Empty statistics report 0 for every figure (a window with no completions has no error).

>>> s = ErrorStats().update(110.0, 100.0).update(90.0, 100.0).update(200.0, 250.0)
>>> s.summary()
{'n': 3, 'rmse_ms': 30.0, 'mae_ms': 23.333, 'mape': 0.133, 'bias_ms': -16.667}
>>> ErrorStats.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, Self

import numpy as np

MIN_PCT_ACTUAL_MS = 1e-3  # actual RTTs below this do not enter MAPE
_FIELDS = ("n", "n_pct", "sum_err", "sum_sq_err", "sum_abs_err", "sum_ape", "sum_actual")


@dataclasses.dataclass(eq=True)
class ErrorStats:
    """Sums over (predicted, actual) pairs; see the module docstring for the figures derived from them."""

    n: int = 0
    n_pct: int = 0
    sum_err: float = 0.0
    sum_sq_err: float = 0.0
    sum_abs_err: float = 0.0
    sum_ape: float = 0.0
    sum_actual: float = 0.0

    def update(self, predicted: float, actual: float) -> Self:
        """Add one pair; a pair with a non-finite member is ignored."""
        if not (math.isfinite(predicted) and math.isfinite(actual)):
            return self
        e = predicted - actual
        self.n += 1
        self.sum_err += e
        self.sum_sq_err += e * e
        self.sum_abs_err += abs(e)
        self.sum_actual += actual
        if actual >= MIN_PCT_ACTUAL_MS:
            self.n_pct += 1
            self.sum_ape += abs(e) / actual
        return self

    def update_many(self, predicted: Iterable[float] | np.ndarray, actual: Iterable[float] | np.ndarray) -> Self:
        """Add many pairs at once (vectorised); same result as calling :meth:`update` for each."""
        p = np.asarray(predicted, dtype=np.float64)
        a = np.asarray(actual, dtype=np.float64)
        if p.shape != a.shape:
            raise ValueError(f"predicted and actual differ in shape: {p.shape} != {a.shape}")
        ok = np.isfinite(p) & np.isfinite(a)
        p, a = p[ok], a[ok]
        e = p - a
        pos = a >= MIN_PCT_ACTUAL_MS
        self.n += int(e.size)
        self.sum_err += float(e.sum())
        self.sum_sq_err += float((e * e).sum())
        self.sum_abs_err += float(np.abs(e).sum())
        self.sum_actual += float(a.sum())
        self.n_pct += int(pos.sum())
        self.sum_ape += float((np.abs(e[pos]) / a[pos]).sum())
        return self

    def merge(self, other: ErrorStats) -> ErrorStats:
        """A new object holding the statistics of both (neither operand changes)."""
        return ErrorStats(**{f: getattr(self, f) + getattr(other, f) for f in _FIELDS})

    __add__ = merge

    @property
    def rmse_ms(self) -> float:
        return math.sqrt(self.sum_sq_err / self.n) if self.n else 0.0

    @property
    def mae_ms(self) -> float:
        return self.sum_abs_err / self.n if self.n else 0.0

    @property
    def bias_ms(self) -> float:
        return self.sum_err / self.n if self.n else 0.0

    @property
    def mape(self) -> float:
        return self.sum_ape / self.n_pct if self.n_pct else 0.0

    @property
    def mean_actual_ms(self) -> float:
        return self.sum_actual / self.n if self.n else 0.0

    @property
    def relative_rmse(self) -> float:
        """RMSE over the mean observed RTT (0 when there is no positive RTT)."""
        mean = self.mean_actual_ms
        return self.rmse_ms / mean if mean > 0 else 0.0

    def summary(self, digits: int = 3) -> dict[str, Any]:
        """The figures a prediction-errors app entry carries (without ``cumulative``), rounded."""
        return {"n": self.n, "rmse_ms": round(self.rmse_ms, digits), "mae_ms": round(self.mae_ms, digits),
                "mape": round(self.mape, digits), "bias_ms": round(self.bias_ms, digits)}

    def to_dict(self) -> dict[str, float | int]:
        """The raw sums, for storage (e.g. a Faust table value)."""
        return {f: getattr(self, f) for f in _FIELDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ErrorStats:
        """Inverse of :meth:`to_dict`; missing fields are 0, unknown fields are an error."""
        unknown = set(d) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown ErrorStats fields: {sorted(unknown)}")
        n, n_pct = int(d.get("n", 0)), int(d.get("n_pct", 0))
        if n < 0 or n_pct < 0 or n_pct > n:
            raise ValueError(f"bad counts n={n}, n_pct={n_pct}")
        return cls(n=n, n_pct=n_pct, **{f: float(d.get(f, 0.0)) for f in _FIELDS[2:]})
