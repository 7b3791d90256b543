"""The RTT-aware policy's feedback loop, every error period (5 s simulated), per node x app.

Completions of the period are paired with the predictions made when their tasks were placed
(:class:`app.drift.errorstats.ErrorStats`). Then, with the production drift code:

- :class:`app.drift.dwa.DynamicWindow` moves the node x app feature window from the period's RMSE;
- :class:`app.drift.credibility.Credibility` turns each node's MAPE into its weight (credibility);
- :class:`app.drift.pagehinkley.PageHinkley` accumulates the MAPE; when it fires, the node's model keys
  (``app:node_class`` and the node's own ``app:node_class:node``, where one exists) are due for a retrain.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from app.drift.credibility import Credibility
from app.drift.dwa import DynamicWindow
from app.drift.errorstats import ErrorStats
from app.drift.pagehinkley import PageHinkley


@dataclasses.dataclass
class PeriodResult:
    """What one period changed: retrains due (model key -> reason), and the state for the trace."""

    retrain: dict[str, str]
    errors: list[tuple[str, float, float]]  # (node:app, mape, rmse_ms)
    weights: dict[str, float]
    windows: dict[str, float]  # node:app -> window_s


class Feedback:
    def __init__(self, *, dwa: bool = True, window_s: float = 30.0, min_window_s: float = 5.0,
                 max_window_s: float = 60.0, prior: float = 0.5, drift_threshold: float = 0.5,
                 drift_min_periods: int = 12) -> None:
        self.dwa = dwa
        self.drift_threshold = drift_threshold
        self.drift_min_periods = drift_min_periods
        self.window_s = window_s
        self.min_window_s = min_window_s
        self.max_window_s = max_window_s
        self.prior = prior
        self._stats: dict[tuple[str, str], ErrorStats] = defaultdict(ErrorStats)
        self._windows: dict[tuple[str, str], DynamicWindow] = {}
        self._detectors: dict[tuple[str, str], PageHinkley] = {}
        self._cred: dict[str, Credibility] = {}
        self._class: dict[str, str] = {}

    def window(self, node: str, app: str) -> float:
        """The feature window in force for ``node`` x ``app`` (fixed when DWA is off)."""
        w = self._windows.get((node, app))
        return w.window_s if w is not None else self.window_s

    def weight(self, node: str) -> float:
        c = self._cred.get(node)
        return c.weight if c is not None else self.prior

    def add(self, node: str, node_class: str, app: str, predicted_ms: float, actual_ms: float) -> None:
        self._class[node] = node_class
        self._stats[(node, app)].update(predicted_ms, actual_ms)

    def close_period(self, ts: float) -> PeriodResult:
        retrain: dict[str, str] = {}
        errors: list[tuple[str, float, float]] = []
        by_node: dict[str, ErrorStats] = defaultdict(ErrorStats)
        for (node, app), st in self._stats.items():
            if st.n == 0:
                continue
            mape, rmse = st.mape, st.rmse_ms
            errors.append((f"{node}:{app}", mape, rmse))
            by_node[node] = by_node[node] + st
            if self.dwa:
                w = self._windows.get((node, app))
                if w is None:
                    w = self._windows[(node, app)] = DynamicWindow(self.min_window_s, self.max_window_s, self.window_s)
                w.update(rmse)
            ph = self._detectors.get((node, app))
            if ph is None:
                ph = self._detectors[(node, app)] = PageHinkley(threshold=self.drift_threshold,
                                                                min_instances=self.drift_min_periods)
            if ph.update(mape, ts).drift_detected:
                reason = f"drift on {node}: cumulative {ph.cumulative:.2f}"
                retrain[f"{app}:{self._class[node]}"] = reason
                retrain[f"{app}:{self._class[node]}:{node}"] = reason
        for node, st in by_node.items():
            c = self._cred.get(node)
            if c is None:
                c = self._cred[node] = Credibility(prior=self.prior)
            c.update(st.mape, st.n)
        self._stats.clear()
        return PeriodResult(retrain, errors, {n: c.weight for n, c in self._cred.items()},
                            {f"{n}:{a}": w.window_s for (n, a), w in self._windows.items()})


class Residuals:
    """Per node x app multiplicative correction of a model's predictions from the latest observed errors.

    Each completion moves the node x app bias ``b`` (log of observed over predicted service time) by
    ``alpha`` towards its own log error, clipped to ``+-clip``; a prediction is then multiplied by
    ``exp(b)``. A throttled GPU, a noisy neighbour or a slowed node shows up in the RTTs of the next few
    tasks long before enough samples have piled up for a retrain to learn it; the bias of an app starts
    over when its model is retrained (the new model has seen those samples).

    >>> r = Residuals(alpha=0.5)
    >>> r.update("n1", "gCTF", predicted_ms=100.0, actual_ms=200.0)
    >>> round(r.factor("n1", "gCTF"), 3), r.factor("n2", "gCTF")
    (1.414, 1.0)
    >>> r.reset("gCTF"); r.factor("n1", "gCTF")
    1.0
    """

    def __init__(self, *, alpha: float = 0.2, clip: float = 0.7) -> None:
        if not 0.0 < alpha <= 1.0 or clip <= 0:
            raise ValueError(f"Residuals: need 0 < alpha <= 1 and clip > 0 (got alpha={alpha}, clip={clip})")
        self.alpha = alpha
        self.clip = clip
        self._bias: dict[tuple[str, str], float] = {}

    def factor(self, node: str, app: str) -> float:
        return math.exp(self._bias.get((node, app), 0.0))

    def update(self, node: str, app: str, predicted_ms: float, actual_ms: float) -> None:
        if not (predicted_ms > 0 and actual_ms > 0 and math.isfinite(predicted_ms) and math.isfinite(actual_ms)):
            return
        err = min(self.clip, max(-self.clip, math.log(actual_ms / predicted_ms)))
        b = self._bias.get((node, app), 0.0)
        self._bias[(node, app)] = b + self.alpha * (err - b)

    def reset(self, app: str) -> None:
        """Forget the biases of ``app`` on every node (its model was retrained)."""
        for k in [k for k in self._bias if k[1] == app]:
            del self._bias[k]
