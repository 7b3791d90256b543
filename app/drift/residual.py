"""Residual correction: a node × app multiplicative factor on the model's predictions, from its recent errors.

Between retrains a model keeps the errors it had when it was trained; a node that slows down, throttles
or gets a noisy neighbour shows up in the RTTs of its next few tasks long before enough samples have
piled up for a retrain to learn it. Per node × app, each completed task moves the bias ``b`` (log of
observed over the *model's* predicted RTT) by ``alpha`` towards its own log error:

``b ← b + alpha · (clip(log(actual / model), ±clip) − b)``

and predictions are multiplied by ``exp(b)`` (:attr:`Residual.factor`). Errors are relative (log), as
RTT noise is multiplicative. ``clip`` only guards against one absurd pair (the default, ``log 20``, lets
a node become 20 times slower or faster than its model says: a GPU dropping to 30 % of its speed is a
factor 3.3, which a ×2 bound could not follow). The worker publishes the factors in node-weights
(``correction``), the extender multiplies its predictions by them; the factor of an app starts over
when a new model of it serves the node (the new model has seen those samples).

>>> r = Residual(alpha=0.5)
>>> round(r.update(model_ms=100.0, actual_ms=200.0).factor, 4)
1.4142
>>> for _ in range(30):
...     _ = r.update(100.0, 330.0)
>>> round(r.factor, 2), r.n
(3.3, 31)
>>> r.reset().factor, r.to_dict()
(1.0, {'bias': 0.0, 'n': 0})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

ALPHA = 0.3
CLIP = math.log(20.0)


class Residual:
    """The residual factor of one node × app.

    Parameters
    ----------
    alpha
        Step of the exponentially weighted log error, in ``(0, 1]`` (0.3: a constant error is 97 %
        learnt after 10 tasks).
    clip
        Bound of one task's log error and so of ``|log factor|``, ``> 0``.
    """

    def __init__(self, alpha: float = ALPHA, clip: float = CLIP) -> None:
        if not (math.isfinite(alpha) and 0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be in (0, 1] (got {alpha})")
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"clip must be > 0 (got {clip})")
        self.alpha = float(alpha)
        self.clip = float(clip)
        self._bias = 0.0
        self._n = 0

    @property
    def factor(self) -> float:
        """``exp(bias)``: what a prediction of the model is multiplied by (1.0 before any task)."""
        return math.exp(self._bias)

    @property
    def bias(self) -> float:
        return self._bias

    @property
    def n(self) -> int:
        """Tasks that moved the bias since the last reset."""
        return self._n

    def update(self, model_ms: float, actual_ms: float) -> Self:
        """One completed task: the model's prediction (before any correction) and the observed RTT.

        A pair that is not two finite positive numbers is ignored.
        """
        if not (model_ms > 0 and actual_ms > 0 and math.isfinite(model_ms) and math.isfinite(actual_ms)):
            return self
        err = min(self.clip, max(-self.clip, math.log(actual_ms / model_ms)))
        self._bias += self.alpha * (err - self._bias)
        self._n += 1
        return self

    def reset(self) -> Self:
        """Start over (a new model serves)."""
        self._bias = 0.0
        self._n = 0
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"bias": self._bias, "n": self._n}

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_dict` wrote (the bias is clipped to this object's bound)."""
        bias, n = float(state.get("bias", 0.0)), int(state.get("n", 0))
        if not math.isfinite(bias) or n < 0:
            raise ValueError(f"bad residual state {dict(state)!r}")
        self._bias = min(self.clip, max(-self.clip, bias))
        self._n = n
        return self


def model_prediction(predicted_ms: float, correction: float | None) -> float:
    """The model's own prediction from a published one that carried ``correction`` (None or bad: 1).

    >>> model_prediction(300.0, 1.5), model_prediction(300.0, None), model_prediction(300.0, float("nan"))
    (200.0, 300.0, 300.0)
    """
    if correction is None or not (math.isfinite(correction) and correction > 0):
        return predicted_ms
    return predicted_ms / correction
