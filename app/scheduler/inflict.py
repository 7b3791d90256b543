"""What a placement costs the pods already running on a node, priced by the same models that predict the pod.

A pod's own predicted RTT is not the whole cost of placing it: on a shared GPU, disk or PCIe link it slows
the pods already running there for as long as they overlap. Ranking nodes by the pod's own time alone piles
work onto the fastest node until the pod's *own* time there is no longer the lowest, while every pod already
there pays for each newcomer; the simulator's clairvoyant reference gains most of its lead over a calibrated
table by counting that slowdown (docs/simulator.md).

The models already know it: a running pod of app ``b`` on node ``n`` is predicted with its neighbours'
counts (``running_pods_<app>``); one more pod of ``app`` beside it changes that prediction. Per candidate

``inflicted = weight · Σ_pods correction_b · remaining · max(0, pred_b(n, N − e_b + e_app) − pred_b(n, N − e_b))``

over the pods the scheduler counts as running there (the task's own running-pods features ``N``; ``e_b`` the
pod itself, which is not its own neighbour), with the pod's input size when the scheduler placed it (an
assumed pod; NaN, the model's default branch, otherwise), the node's residual correction for ``b``, and
``remaining`` the share of the pod's expected run still ahead (:meth:`AssumedPod.remaining`; 0.5 for a pod
known only from the running-apps view). A pod whose app has no model covering the node adds nothing.
Everything is batched: one ``predict`` per model over all (candidate, pod) pairs, two rows each.

The extender and the simulator's ``rtt_aware`` score ``own + inflicted`` (policy ``objective.inflicted``,
the ``weight``; 0 turns it off); what rtt-predictions carries stays the pod's own prediction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from app.features.vector import RUNNING_PREFIX
from app.scheduler.assumed import AssumedPod
from app.scheduler.snapshot import Snapshot
from app.scheduler.table import AppRoutes

UNKNOWN_REMAINING = 0.5  # a running pod the scheduler did not place: half-way through, on average
TASK_INPUT = "task_input_size_mb"


def inflicted_ms(snapshot: Snapshot, app: str, nodes: Sequence[str], at: np.ndarray, candidates: Sequence[int],
                 features: Sequence[Mapping[str, float]], live: Mapping[int, Sequence[AssumedPod]], now: float,
                 weight: float) -> np.ndarray:
    """Per node of ``nodes``: the time (ms) a pod of ``app`` placed there adds to the pods running there.

    ``at``: the nodes' positions in ``snapshot.table``; ``candidates``: the indices to price (fresh nodes
    with something running); ``features``: each node's running-pods features, the same names for every
    priced candidate (:func:`~app.scheduler.decide.running_features` of one tuple of apps); ``live``: per
    candidate, the assumed pods not expected to have finished, without the pod itself
    (:meth:`AssumedPods.scan`; a candidate without an entry has none).

    Rows are laid out with array operations: a (candidate, running app) pair per candidate and app that runs
    there with a model covering the node, in candidate order; per pair, one row per pod (its assumed pods,
    newest first, then pods known only from the running-apps view); per (app, model) one ``predict``, the
    groups in the order their first pair comes.
    """
    out = np.zeros(len(nodes))
    if weight <= 0 or not candidates:
        return out
    cand = np.asarray(candidates, dtype=np.int64)
    names = tuple(features[candidates[0]])
    if any(len(features[i]) != len(names) for i in candidates):
        raise ValueError("every priced candidate needs the same running-pods features")
    counts = np.array([[features[i][name] for name in names] for i in candidates],
                      dtype=np.float64).reshape(len(candidates), len(names))
    priced_at = at[cand]
    valid = counts > 0
    model = np.full(counts.shape, -1, dtype=np.int64)
    corr = np.ones(counts.shape)
    routes_of: list[AppRoutes | None] = []
    for k, name in enumerate(names):
        routes = snapshot.app_routes(name[len(RUNNING_PREFIX):]) if valid[:, k].any() else None
        routes_of.append(routes)
        if routes is not None:
            model[:, k] = routes.model[priced_at]
            corr[:, k] = routes.correction[priced_at]
    valid &= model >= 0
    pair_r, pair_k = np.nonzero(valid)  # (candidate row, app column) pairs, candidate by candidate
    if not pair_r.size:
        return out
    pods_of = counts[pair_r, pair_k].astype(np.int64)
    starts = np.cumsum(pods_of) - pods_of
    mb = np.full(int(pods_of.sum()), math.nan)  # rows: a pod each; unknown pods keep NaN and UNKNOWN_REMAINING
    left = np.full(mb.size, UNKNOWN_REMAINING)
    if live:
        _known_pods(live, candidates, names, pair_r.tolist(), pair_k.tolist(), starts.tolist(), pods_of.tolist(),
                    now, mb, left)
    pair_of_row = np.repeat(np.arange(pair_r.size), pods_of)
    row_r = pair_r[pair_of_row]
    scale = corr[pair_r, pair_k][pair_of_row] * left
    pair_model = model[pair_r, pair_k]
    key = pair_k * (int(pair_model.max()) + 1) + pair_model
    keys, first = np.unique(key, return_index=True)
    order = np.argsort(first)  # groups in the order of their first pair
    rank = np.empty(keys.size, dtype=np.int64)
    rank[order] = np.arange(keys.size)
    row_rank = rank[np.searchsorted(keys, key)][pair_of_row]
    rows_by_group = np.argsort(row_rank, kind="stable")
    bounds = np.searchsorted(row_rank[rows_by_group], np.arange(keys.size + 1))
    column_of = {name: k for k, name in enumerate(names)}
    own = RUNNING_PREFIX + app
    for g in range(keys.size):
        q = int(first[order[g]])
        k, m = int(pair_k[q]), int(pair_model[q])
        routes = routes_of[k]
        assert routes is not None  # noqa: S101 - a pair has routes
        entry = routes.entries[m]
        rows = rows_by_group[bounds[g]:bounds[g + 1]]
        r = row_r[rows]
        X = entry.matrix[np.repeat(routes.row[priced_at[r]], 2)]
        input_col = entry.task_columns.get(TASK_INPUT)
        for name, col in entry.task_columns.items():
            if name != TASK_INPUT:
                X[:, col] = math.nan
        for j, name in enumerate(entry.feature_names):
            if not name.startswith(RUNNING_PREFIX):
                continue
            c = column_of.get(name)
            column = np.zeros(r.size) if c is None else counts[r, c]
            if c == k:
                column = column - 1.0  # the pod is not its own neighbour
            X[0::2, j] = column  # without the pod
            X[1::2, j] = column + 1.0 if name == own else column  # with it
        if input_col is not None:
            X[:, input_col] = np.repeat(mb[rows], 2)
        pred = np.asarray(entry.predictor.predict(X), dtype=np.float64)
        delta = np.maximum(0.0, pred[1::2] - pred[0::2])
        delta[~np.isfinite(delta)] = 0.0
        np.add.at(out, cand[r], weight * delta * scale[rows])
    return out


def _known_pods(live: Mapping[int, Sequence[AssumedPod]], candidates: Sequence[int], names: Sequence[str],
                pair_r: list[int], pair_k: list[int], starts: list[int], pods_of: list[int], now: float,
                mb: np.ndarray, left: np.ndarray) -> None:
    """Fill the rows of the assumed pods, newest first within each pair: input MB, and the share of the pod's
    expected run still ahead (:meth:`AssumedPod.remaining`, on arrays)."""
    column_of = {name[len(RUNNING_PREFIX):]: k for k, name in enumerate(names)}
    pair_of = {(r, k): q for q, (r, k) in enumerate(zip(pair_r, pair_k, strict=True))}
    filled = [0] * len(pair_r)
    at: list[int] = []
    placed: list[float] = []
    until: list[float] = []
    for r, i in enumerate(candidates):
        pods = live.get(i)
        if not pods:
            continue
        for p in reversed(pods):
            q = pair_of.get((r, column_of.get(p.app, -1)))
            if q is None or filled[q] >= pods_of[q]:
                continue
            at.append(starts[q] + filled[q])
            filled[q] += 1
            mb[at[-1]] = p.input_mb
            placed.append(p.placed_at)
            until.append(p.until)
    if at:
        end = np.array(until)
        span = end - np.array(placed)
        with np.errstate(invalid="ignore"):
            timed = np.isfinite(span) & (span > 0)
            left[at] = np.where(timed, np.minimum(1.0, np.maximum(0.0, (end - now) / np.where(timed, span, 1.0))),
                                UNKNOWN_REMAINING)
