"""One retrain, as a blocking function: split, select features, train the challenger, score both models.

Run off the event loop (the service uses a one-thread executor). Steps, for a key's rows in time order:

1. **Split**: the most recent ``ceil(holdout_fraction · n)`` rows are the holdout; the rest is the fit set.
   After a drift (``onset_ts``: when the error began to rise), the rows that started at or after the
   onset alternate between the fit set and the holdout, and as many of the newest rows before it
   complete the holdout: otherwise a key with a long history would keep every post-drift row in the
   holdout (the newest 20 % of 50,000 samples is minutes of tasks), train the challenger on the old
   regime only and judge it mostly there — the drift could not be learnt until it filled the holdout,
   and a drift on a node with short RTTs would hardly move the RMSE of thousands of older rows.
2. **Select** (:func:`app.features.selection.select_features`) on the most recent ``selection_max_rows``
   fit rows (after a drift, with the rows since the onset weighted as in step 3, so a feature that
   explains the new regime wins the vote), over the candidate columns that vary (≥ 2 distinct finite
   values). Hardware descriptors and task features (``hw_*``, ``task_input_size_mb``, the scheduler's
   ``running_pods_<app>`` counts) that have any value are always kept (:func:`always_kept`): they are
   what lets a class model predict for a node it has never seen, and what the scheduler knows exactly
   at decision time. When the GPU models of the key's nodes do not report the same metrics, each
   model's rows vote on the metrics they have and the model takes the union
   (:func:`app.features.classes.select_by_class`). When the selection keeps no candidate,
   :data:`FALLBACK` says what is used: ``"all"`` every varying column, ``"none"`` no metric column
   (docs/feedback.md has the measurement).
3. **Train** (:func:`app.model.train.train_model`) on the fit rows and the kept columns, with the
   holdout excluded (``holdout_fraction=0``: the split is ours, so both models see the same holdout),
   under the monotone constraints of :func:`app.model.constraints.monotone_constraints`. After a drift,
   each fit row since the onset weighs :data:`AFTER_ONSET_COPIES` rows (:func:`emphasise_after`).
4. **Score** the challenger and, in :func:`score_champion`, the champion on the same holdout rows,
   each with its own feature names (a column the holdout lacks is missing, NaN). The champion is judged
   only on the holdout rows it cannot have fitted, those that started after the last row of its fit set
   (:func:`unseen`; its registry record's ``training_window``), and the challenger on the same rows: after a
   drift the champion fitted every other row since the onset, and a later plain holdout (the newest rows)
   can hold many of them, on which it scores better than on rows it never saw.

:func:`retrain` is the whole retrain — the steps above and the champion/challenger verdict
(:func:`app.trainer.champion.judge`) — as the trainer service and the simulator's ``rtt_aware`` both run it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from app.features.classes import CLASS_FEATURES, class_labels, select_by_class
from app.features.hardware import HARDWARE_FEATURES
from app.features.vector import RUNNING_PREFIX, TASK_FEATURES
from app.model.base import Predictor
from app.model.constraints import monotone_constraints
from app.model.errors import NotEnoughSamplesError
from app.model.train import MIN_SAMPLES, TrainResult, evaluate, train_model
from app.trainer.champion import MARGIN, Verdict, judge
from app.trainer.history import Dataset

log = logging.getLogger(__name__)

ALWAYS_KEPT = frozenset(HARDWARE_FEATURES) | frozenset(TASK_FEATURES)
HOLDOUT_FRACTION = 0.2
SELECTION_MAX_ROWS = 1_000  # the vote's newest fit rows (docs/feedback.md: measured against 2,000 and 500)
MIN_AFTER_ONSET = 10  # rows after a drift's onset needed to share them between fit and holdout
MIN_UNSEEN = 10  # holdout rows after the champion's fit set needed to judge on them alone
JUDGED_AFTER = "judged_after_ts"  # in a champion's metrics: scored only on the holdout rows after this time
AFTER_ONSET_COPIES = 10  # weight of a fit row from after a drift's onset (as repeated rows)
FALLBACKS = ("all", "none")
FALLBACK = "none"  # the selection kept nothing: no metric column (docs/feedback.md: measured against "all")
SELECTION_TOP_K = 12  # each measure votes for its 12 strongest features at most (docs/feedback.md)
METRIC_MIN_ROWS = 500  # fit rows before metric columns may enter a model (docs/feedback.md: measured)

Selector = Callable[[np.ndarray, np.ndarray, Sequence[str]], Sequence[str]]


@dataclasses.dataclass(frozen=True, eq=False)
class Challenger:
    """A trained challenger with the holdout it was scored on."""

    result: TrainResult
    holdout: Dataset
    metrics: dict[str, float]
    selected: tuple[str, ...]
    n_fit: int
    fit_window: tuple[float, float]
    seconds: float

    def score(self, rows: Dataset) -> dict[str, float]:
        """The challenger's metrics on ``rows`` (its :attr:`metrics` are those on its whole holdout)."""
        booster = self.result.booster
        return score(lambda X: booster.inplace_predict(X, missing=np.nan), self.selected, rows)


def default_selector(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Sequence[str]:
    """The project's feature selection: five correlation measures, 3-of-5 vote, each measure voting for its
    :data:`SELECTION_TOP_K` strongest features at most (:func:`app.features.selection.consensus`: the same
    choice as ``select_features``, with MIC computed only when its votes can change it)."""
    # Late on purpose: scipy.stats and the MIC/dcor kernels (~0.5 s) load on the first retrain, in the
    # training thread, not when the trainer (or the simulator) starts.
    from app.features.selection import SelectionRule, consensus

    return consensus(X, y, list(names), SelectionRule(top_k=SELECTION_TOP_K))


def fit_rows(n: int, holdout_fraction: float = HOLDOUT_FRACTION) -> int:
    """Rows left to fit when the plain split holds out the newest ``ceil(fraction · n)`` (at least 1) of ``n``.

    >>> fit_rows(625), fit_rows(624), fit_rows(25)
    (500, 499, 20)
    """
    return n - max(1, math.ceil(n * holdout_fraction))


def split(ds: Dataset, holdout_fraction: float = HOLDOUT_FRACTION,
          onset_ts: float | None = None) -> tuple[Dataset, Dataset]:
    """(fit, holdout), each in time order.

    Without ``onset_ts`` the holdout is the most recent ``ceil(fraction · n)`` rows. After a drift
    (``onset_ts``) it is every other row since the onset plus as many of the newest rows before it: the
    new regime and the old one weigh the same in the verdict, whatever the rest of the history holds.
    With fewer than :data:`MIN_AFTER_ONSET` rows since the onset, so many that they fill twice the plain
    holdout, or too few rows before it, the split is the plain one.

    >>> import numpy as np
    >>> ds = Dataset(np.zeros((10, 1), np.float32), np.arange(10.0), np.arange(10.0), ("a",))
    >>> [len(p) for p in split(ds, 0.2)], split(ds, 0.2)[1].ts.tolist()
    ([8, 2], [8.0, 9.0])
    >>> ds = Dataset(np.zeros((40, 1), np.float32), np.arange(40.0), np.arange(40.0), ("a",))
    >>> fit, holdout = split(ds, 0.2, onset_ts=28.0)
    >>> holdout.ts.tolist()
    [22.0, 23.0, 24.0, 25.0, 26.0, 27.0, 29.0, 31.0, 33.0, 35.0, 37.0, 39.0]
    >>> fit.ts[-7:].tolist()
    [21.0, 28.0, 30.0, 32.0, 34.0, 36.0, 38.0]
    """
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1) (got {holdout_fraction})")
    n = len(ds)
    n_holdout = n - fit_rows(n, holdout_fraction)
    start = int(np.searchsorted(ds.ts, onset_ts, side="left")) if onset_ts is not None else n
    after = np.arange(start, n)
    held_after = after[1::2]
    if after.size < MIN_AFTER_ONSET or after.size >= 2 * n_holdout or start < held_after.size:
        return ds.rows(0, n - n_holdout), ds.rows(n - n_holdout)
    before = start - held_after.size
    fit = np.concatenate([np.arange(0, before), after[0::2]])
    holdout = np.concatenate([np.arange(before, start), held_after])
    return ds.take(fit), ds.take(holdout)


def emphasise_after(fit: Dataset, onset_ts: float, copies: int) -> Dataset:
    """``fit`` with each row that started at or after ``onset_ts`` repeated, to weigh ``copies`` rows.

    Seconds after a drift there are a few dozen such rows among tens of thousands: unweighted, the
    boosted trees barely move for them (measured: a challenger 2 % worse than the champion, or the
    drifted node's error only down from 0.50 to 0.33 MAPE; with 5–50 copies, 0.06–0.08). The copies
    are bounded so that those rows never outweigh the rows before the onset.

    >>> import numpy as np
    >>> ds = Dataset(np.zeros((10, 1), np.float32), np.arange(10.0), np.arange(10.0), ("a",))
    >>> emphasise_after(ds, 8.0, 3).ts[6:].tolist()
    [6.0, 7.0, 8.0, 8.0, 8.0, 9.0, 9.0, 9.0]
    >>> len(emphasise_after(ds, 7.0, 3)), len(emphasise_after(ds, 4.0, 3))  # never heavier than the rows before
    (13, 10)
    """
    start = int(np.searchsorted(fit.ts, onset_ts, side="left"))
    n_after = len(fit) - start
    copies = min(copies, start // n_after) if n_after else 1
    if copies <= 1:
        return fit
    index = np.concatenate([np.arange(start), np.repeat(np.arange(start, len(fit)), copies)])
    return fit.take(index)


def varying_columns(ds: Dataset) -> list[str]:
    """Names of the columns with at least two distinct finite values."""
    out = []
    for j, name in enumerate(ds.names):
        col = ds.X[:, j]
        finite = col[np.isfinite(col)]
        if finite.size >= 2 and finite.min() != finite.max():
            out.append(name)
    return out


def always_kept(name: str) -> bool:
    """Columns selection never drops: hardware descriptors, task attributes, running pods.

    >>> always_kept("running_pods_gCTF"), always_kept("hw_gpu_fp32_tflops"), always_kept("cpu_iowait__mean")
    (True, True, False)
    """
    return name in ALWAYS_KEPT or name.startswith(RUNNING_PREFIX)


def choose_features(fit: Dataset, selector: Selector | None, max_rows: int = SELECTION_MAX_ROWS,
                    fallback: str = FALLBACK, metric_min_rows: int = METRIC_MIN_ROWS) -> tuple[str, ...]:
    """The model's columns: the selector's choice among varying columns, plus the :func:`always_kept` ones.

    Without a selector every varying column is used; when it keeps nothing, ``fallback`` decides
    (``"all"``: every varying column, ``"none"``: none of them). With fewer than ``metric_min_rows`` fit
    rows no metric column is a candidate: on a few dozen rows the measures vote for noise (a metric that
    happens to separate the first nodes' tasks), and a model that reads it ranks nodes by it.

    >>> import numpy as np
    >>> X = np.column_stack([np.arange(60.0), np.arange(60.0) % 7]).astype(np.float32)
    >>> ds = Dataset(X, np.arange(60.0) + 1, np.arange(60.0), ("task_input_size_mb", "cpu_iowait__mean"))
    >>> choose_features(ds, None), choose_features(ds, None, metric_min_rows=50)
    (('task_input_size_mb',), ('cpu_iowait__mean', 'task_input_size_mb'))
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS} (got {fallback!r})")
    candidates = [n for n in varying_columns(fit) if not always_kept(n)] if len(fit) >= metric_min_rows else []
    kept = [n for j, n in enumerate(fit.names) if always_kept(n) and np.isfinite(fit.X[:, j]).any()]
    chosen = candidates
    if selector is not None and candidates:
        recent = fit.rows(max(0, len(fit) - max_rows))
        labels = class_labels(recent.columns(CLASS_FEATURES))
        picked = set(select_by_class(selector, recent.columns(candidates), recent.y, candidates, labels).chosen)
        chosen = [n for n in candidates if n in picked] or (candidates if fallback == "all" else [])
    names = tuple(chosen + kept)
    return names if names else fit.names


def train_challenger(ds: Dataset, node_class: str, *, holdout_fraction: float = HOLDOUT_FRACTION,
                     selector: Selector | None = default_selector, selection_max_rows: int = SELECTION_MAX_ROWS,
                     seed: int = 0, params: Mapping[str, Any] | None = None,
                     onset_ts: float | None = None, after_onset_copies: int = AFTER_ONSET_COPIES,
                     monotone: bool = True, gpu_app: bool = False, fallback: str = FALLBACK,
                     metric_min_rows: int = METRIC_MIN_ROWS) -> Challenger:
    """Split, select, train and score a challenger (blocking; raises the model layer's errors).

    ``onset_ts``: the drift's estimated onset (a retrain-event's ``onset_ts``): see :func:`split`, and
    the fit rows since the onset weigh ``after_onset_copies`` rows each (:func:`emphasise_after`).
    ``monotone``: train under :func:`~app.model.constraints.monotone_constraints` (``gpu_app``: the app
    runs on the GPU, so a faster GPU never slows it) unless ``params`` sets its own.
    """
    t0 = time.perf_counter()
    fit, holdout = split(ds, holdout_fraction, onset_ts)
    if len(fit) < MIN_SAMPLES:
        raise NotEnoughSamplesError(len(fit), MIN_SAMPLES)
    train = emphasise_after(fit, onset_ts, after_onset_copies) if onset_ts is not None else fit
    names = choose_features(train, selector, selection_max_rows, fallback,  # the new regime counts in the vote too
                            metric_min_rows)
    merged = dict(params or {})
    if monotone and "monotone_constraints" not in merged:
        merged["monotone_constraints"] = monotone_constraints(names, gpu_app)
    result = train_model(train.columns(names), train.y, names, node_class, holdout_fraction=0.0, seed=seed,
                         params=merged)
    challenger = Challenger(result, holdout, {}, names, len(fit), (float(fit.ts[0]), float(fit.ts[-1])), 0.0)
    metrics = challenger.score(holdout)
    seconds = time.perf_counter() - t0
    log.info("challenger %s: %d fit rows, %d features, holdout rmse %.1f ms (%.2fs)", node_class, len(fit),
             len(names), metrics["rmse_ms"], seconds)
    return dataclasses.replace(challenger, metrics=metrics, seconds=seconds)


def score(predict: Callable[[np.ndarray], np.ndarray], names: Sequence[str], holdout: Dataset) -> dict[str, float]:
    """Holdout metrics of a model that reads the columns ``names``; non-finite predictions make NaN metrics."""
    m = evaluate(predict, holdout.columns(names), holdout.y)
    return {k: float(v) for k, v in m.items()}


def unseen(holdout: Dataset, fit_end_ts: float | None, min_rows: int = MIN_UNSEEN) -> Dataset:
    """The rows of ``holdout`` (in time order) that started after ``fit_end_ts``, the last row a champion was
    fitted on: rows it cannot have trained on. The whole holdout when ``fit_end_ts`` is None (not known) or
    fewer than ``min_rows`` rows are left (judged as before, on rows it may have fitted: the verdict then
    favours the champion, which keeps the model in service).

    >>> import numpy as np
    >>> ds = Dataset(np.zeros((30, 1), np.float32), np.arange(30.0), np.arange(30.0), ("a",))
    >>> len(unseen(ds, 14.0)), len(unseen(ds, 25.0)), len(unseen(ds, None))
    (15, 30, 30)
    """
    if fit_end_ts is None:
        return holdout
    start = int(np.searchsorted(holdout.ts, fit_end_ts, side="right"))
    return holdout.rows(start) if len(holdout) - start >= min_rows and start else holdout


def score_champion(champion: Predictor, holdout: Dataset, fit_end_ts: float | None = None) -> dict[str, float]:
    """The champion's metrics on the challenger's holdout (its own feature names and order), on its
    :func:`unseen` rows when ``fit_end_ts`` (its fit set's last row) is known: then with :data:`JUDGED_AFTER`,
    which :func:`judge_challenger` scores the challenger after too."""
    rows = unseen(holdout, fit_end_ts)
    metrics = score(champion.predict, champion.feature_names, rows)
    if rows is not holdout:
        assert fit_end_ts is not None  # rows were cut after it
        metrics[JUDGED_AFTER] = fit_end_ts
    return metrics


def judge_challenger(challenger: Challenger, champion: Mapping[str, float] | None, *,
                     margin: float = MARGIN) -> Verdict:
    """:func:`~app.trainer.champion.judge` on the rows both were scored on: the challenger's whole holdout, or
    the rows after ``champion[JUDGED_AFTER]`` (:func:`score_champion`)."""
    ours: Mapping[str, float] = challenger.metrics
    if champion is not None and JUDGED_AFTER in champion:
        ours = challenger.score(unseen(challenger.holdout, champion[JUDGED_AFTER]))
    return judge(ours, champion, margin=margin)


def retrain(ds: Dataset, node_class: str, champion: Callable[[Dataset], Mapping[str, float] | None], *,
            margin: float = MARGIN, **options: Any) -> tuple[Challenger, Verdict]:
    """One whole retrain: :func:`train_challenger` on ``ds`` (``options`` are its keyword arguments), then the
    verdict of :func:`judge_challenger` against ``champion(holdout)`` — the champion's metrics on the
    challenger's holdout (:func:`score_champion`), None when there is no champion (the service reads it from
    the registry, the simulator scores the model it serves)."""
    challenger = train_challenger(ds, node_class, **options)
    return challenger, judge_challenger(challenger, champion(challenger.holdout), margin=margin)
