"""The trainer process, simulated: :func:`app.trainer.pipeline.retrain` off the decision path, in simulated time.

A retrain asked at simulated time ``t`` runs the trainer's own :func:`~app.trainer.pipeline.retrain` —
feature selection, balancing, the node class's preset with the monotone constraints, the post-onset
split and weighting after a drift, and the champion/challenger verdict — on a snapshot of the key's
:class:`~app.trainer.history.SampleHistory` taken at ``t``, in a background thread, and its verdict
becomes known at ``t + delay`` (simulated), whatever the wall time it took: a retrain never stalls a
placement, and a run is reproducible bit for bit (the thread only decides *when* the wall clock
finishes, never *what* the model is). The delay is :class:`VerdictDelay`'s, by the size of the key's fit
set: what the live system measured from the worker's retrain-event to the extender's model install. As
the trainer service does, a key being trained takes no second retrain until the first is done (the ask
is coalesced).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from app.contracts.keys import parse_model_key
from app.errors import RttError
from app.model.base import Predictor
from app.trainer.history import Dataset
from app.trainer.pipeline import (
    HOLDOUT_FRACTION,
    METRIC_MIN_ROWS,
    Challenger,
    Selector,
    Verdict,
    default_selector,
    fit_rows,
    retrain,
    score_champion,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VerdictDelay:
    """Simulated seconds from a retrain's ask to its model serving, by the rows of the key's snapshot.

    ``base_s`` below :data:`~app.trainer.pipeline.METRIC_MIN_ROWS` fit rows (the trainer's Kafka and
    registry round trips, the extender's fetch), ``vote_s`` more from there on (the feature vote runs),
    and ``per_fit_row_s`` for each fit row (fit rows: the rows less the newest ``holdout_fraction``, as
    the plain split). Calibrated on the live system, worker's retrain-event → extender's "model …
    installed" (docs/simulator.md): 40 updates below 500 fit rows in two demo runs, median 0.15 s
    (0.10–0.48); 4 of 553–946 fit rows, 0.42–0.95 s (median 0.72); a key of 50,000 samples (40,000
    fit rows), 1.1–1.3 s (``bench/bench_promotion.py``, docs/feedback.md).

    >>> d = VerdictDelay()
    >>> round(d(100), 3), round(d(625), 3), round(d(50_000), 3)
    (0.151, 0.706, 1.18)
    """

    base_s: float = 0.15
    vote_s: float = 0.55
    per_fit_row_s: float = 12e-6
    holdout_fraction: float = HOLDOUT_FRACTION
    metric_min_rows: int = METRIC_MIN_ROWS

    def __post_init__(self) -> None:
        for name in ("base_s", "vote_s", "per_fit_row_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"VerdictDelay: {name} must be >= 0 (got {getattr(self, name)})")

    def __call__(self, rows: int) -> float:
        fit = fit_rows(rows, self.holdout_fraction)
        return self.base_s + (self.vote_s if fit >= self.metric_min_rows else 0.0) + self.per_fit_row_s * fit


@dataclasses.dataclass(frozen=True)
class Champion:
    """The model a key serves, as a retrain judges it: the predictor and the start time of the last row it was
    fitted on (its registry record's ``training_window`` end; None: not known)."""

    predictor: Predictor
    fit_end_ts: float | None


@dataclasses.dataclass(frozen=True)
class Done:
    """A retrain whose verdict is known (``due_s``: when it counts, simulated seconds); ``challenger`` and
    ``verdict`` are None when it could not train."""

    key: str
    reason: str
    asked_s: float
    due_s: float
    challenger: Challenger | None
    verdict: Verdict | None
    detail: str = ""


def _run(ds: Dataset, key: str, champion: Champion | None, options: Mapping[str, Any]) -> tuple[Challenger, Verdict]:
    def champion_metrics(holdout: Dataset) -> dict[str, float] | None:
        return score_champion(champion.predictor, holdout, champion.fit_end_ts) if champion is not None else None

    return retrain(ds, parse_model_key(key)[1], champion_metrics, **options)


class SimulatedTrainer:
    """Retrains of a simulated run; ask with :meth:`submit`, collect with :meth:`ready`.

    Parameters
    ----------
    delay_s
        Simulated seconds from the ask to the verdict: a number ``>= 0``, or a function of the snapshot's
        rows (default: :class:`VerdictDelay`'s calibration).
    seed
        XGBoost's seed.
    params
        Overrides of the preset (the simulator passes ``nthread=1``: one background thread, reproducible).
    selector
        Feature selection (None: every varying column), as :class:`app.trainer.service.TrainerService`.
    gpu_apps
        Apps that run on a GPU (their monotone constraints include GPU speed).
    background
        Train in a thread (False: inline, at the ask).
    options
        Further keyword arguments of :func:`~app.trainer.pipeline.retrain` (e.g. ``fallback``, ``margin``).
    """

    def __init__(self, *, delay_s: float | Callable[[int], float] = VerdictDelay(), seed: int = 0,
                 params: Mapping[str, Any] | None = None,
                 selector: Selector | None = default_selector, gpu_apps: Collection[str] = (),
                 background: bool = True, options: Mapping[str, Any] | None = None) -> None:
        if not callable(delay_s) and not delay_s >= 0:
            raise ValueError(f"delay_s must be >= 0 (got {delay_s})")
        fixed = float(delay_s) if not callable(delay_s) else 0.0
        self.delay_s: Callable[[int], float] = delay_s if callable(delay_s) else (lambda _rows: fixed)
        self.options: dict[str, Any] = {"seed": seed, "params": dict(params or {}), "selector": selector,
                                        **(options or {})}
        self.gpu_apps = frozenset(gpu_apps)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sim-trainer") if background else None
        self._due: dict[str, tuple[float, str, float, concurrent.futures.Future[tuple[Challenger, Verdict]]]] = {}
        self.coalesced = 0
        self.waited_s = 0.0  # wall seconds ready() spent waiting for a retrain still running when its verdict was due
        self.trained_s = 0.0  # wall seconds the retrains ran, in their thread (failed ones included)

    def _timed(self, ds: Dataset, key: str, champion: Champion | None,
               options: Mapping[str, Any]) -> tuple[Challenger, Verdict]:
        started = time.perf_counter()
        try:
            return _run(ds, key, champion, options)
        finally:
            self.trained_s += time.perf_counter() - started  # one retrain at a time: one thread adds

    def busy(self, key: str) -> bool:
        return key in self._due

    @property
    def due_s(self) -> float:
        """When the next verdict is due (simulated seconds; ``inf``: none asked)."""
        return min((due for due, *_rest in self._due.values()), default=math.inf)

    def submit(self, key: str, reason: str, now_s: float, ds: Dataset, champion: Champion | None,
               onset_ts: float | None = None) -> bool:
        """Ask a retrain of ``key`` on ``ds``; False when one is already running for it (coalesced)."""
        if key in self._due:
            self.coalesced += 1
            return False
        options = {**self.options, "onset_ts": onset_ts, "gpu_app": parse_model_key(key)[0] in self.gpu_apps}
        job: Callable[[], tuple[Challenger, Verdict]] = functools.partial(self._timed, ds, key, champion, options)
        if self._pool is not None:
            future = self._pool.submit(job)
        else:
            future = concurrent.futures.Future()
            try:
                future.set_result(job())
            except Exception as exc:  # delivered by ready(), like a background failure
                future.set_exception(exc)
        self._due[key] = (now_s + self.delay_s(len(ds)), reason, now_s, future)
        return True

    def ready(self, now_s: float) -> list[Done]:
        """Retrains whose verdict is due by ``now_s``, in the order they become due (waits for the thread)."""
        due = sorted((ready_s, key) for key, (ready_s, *_rest) in self._due.items() if ready_s <= now_s)
        out = []
        for _, key in due:
            due_s, reason, asked_s, future = self._due.pop(key)
            started = time.perf_counter()
            try:
                challenger, verdict = future.result()
            except (RttError, ValueError) as exc:  # too few usable rows, degenerate data
                log.info("retrain of %s skipped: %s", key, exc)
                out.append(Done(key, reason, asked_s, due_s, None, None, str(exc)))
                continue
            finally:
                self.waited_s += time.perf_counter() - started
            out.append(Done(key, reason, asked_s, due_s, challenger, verdict))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
