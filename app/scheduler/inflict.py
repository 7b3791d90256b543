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
Everything is batched: one ``predict`` per model over all (candidate, pod) pairs, two rows each; the rows are
laid out, and the predictions summed, by compiled code.

The extender and the simulator's ``rtt_aware`` score ``own + inflicted`` (policy ``objective.inflicted``,
the ``weight``; 0 turns it off); what rtt-predictions carries stays the pod's own prediction.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence

import numba
import numpy as np

from app.features.vector import RUNNING_PREFIX
from app.scheduler.assumed import AssumedPod
from app.scheduler.entries import ModelEntry
from app.scheduler.memo import ByIdentity
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

    Rows: a (candidate, running app) pair per candidate and app that runs there with a model covering the
    node, in candidate order; per pair, one row per pod (its assumed pods, newest first, then pods known only
    from the running-apps view); per (app, model) one ``predict``, the groups in the order their first pair
    comes, and the terms added in that order (:func:`_layout`, :func:`_group_rows`, :func:`_add_terms`).
    """
    out = np.zeros(len(nodes))
    if weight <= 0 or not candidates:
        return out
    cand = np.asarray(candidates, dtype=np.int64)
    names = tuple(features[candidates[0]])
    if any(len(features[i]) != len(names) for i in candidates):
        raise ValueError("every priced candidate needs the same running-pods features")
    if not names:
        return out
    get = operator.itemgetter(*names)
    counts = np.array([get(features[i]) for i in candidates], dtype=np.float64).reshape(len(candidates), len(names))
    priced_at = at[cand]
    model = np.full(counts.shape, -1, dtype=np.int64)
    corr = np.ones(counts.shape)
    routes_of: list[AppRoutes | None] = []
    busy = np.asarray((counts > 0).any(axis=0), dtype=bool).tolist()
    for k, name in enumerate(names):
        routes = snapshot.app_routes(name[len(RUNNING_PREFIX):]) if busy[k] else None
        routes_of.append(routes)
        if routes is not None:
            model[:, k] = routes.model[priced_at]
            corr[:, k] = routes.correction[priced_at]
    row_r, mb, scale, bounds, group_k, group_m = _layout(counts, model, corr, *_live_pods(live, candidates, names), now)
    own = RUNNING_PREFIX + app
    for g in range(group_k.size):
        k, m = int(group_k[g]), int(group_m[g])
        routes = routes_of[k]
        assert routes is not None  # noqa: S101 - a group has routes
        entry = routes.entries[m]
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        run_j, run_c, own_j, blank, input_col = _entry_columns(entry, names, own)
        X = _group_rows(entry.matrix, routes.row, priced_at, row_r[lo:hi], counts, mb[lo:hi], k, run_j, run_c,
                        own_j, blank, input_col)
        pred = np.asarray(entry.predictor.predict(X), dtype=np.float64)
        _add_terms(out, cand, row_r[lo:hi], pred, scale[lo:hi], weight)
    return out


def warm_kernels() -> None:
    """Compile (or load from numba's cache) the compiled steps of :func:`inflicted_ms` for the argument types it
    passes them (a read-only float32 model matrix, int64 indices, float64 counts), so that the first request that
    prices a slowdown does not wait for them (seconds with an empty cache)."""
    index, values = np.zeros(1, dtype=np.int64), np.ones(1)
    counts, model = np.ones((1, 1)), np.zeros((1, 1), dtype=np.int64)
    row_r, mb, scale, _, _, _ = _layout(counts, model, counts, index, index, values, np.zeros(1), values, 0.5)
    matrix = np.zeros((1, 2), dtype=np.float32)
    matrix.setflags(write=False)
    X = _group_rows(matrix, index, index, row_r, counts, mb, 0, index, index, 0, np.empty(0, dtype=np.int64), 1)
    _add_terms(np.zeros(1), index, row_r, np.zeros(X.shape[0]), scale, 1.0)


def _live_pods(live: Mapping[int, Sequence[AssumedPod]], candidates: Sequence[int],
               names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The assumed pods of apps among ``names``, candidate by candidate, newest first: (candidate row, app
    column, input MB, placed at, expected end)."""
    column_of = {name[len(RUNNING_PREFIX):]: k for k, name in enumerate(names)}
    rk: list[int] = []  # candidate row and app column, pod after pod
    times: list[float] = []  # input MB, placed at, expected end, pod after pod
    get = live.get
    for r, i in enumerate(candidates):
        pods = get(i)
        if pods:
            for p in reversed(pods):
                k = column_of.get(p.app)
                if k is not None:
                    rk += (r, k)
                    times += (p.input_mb, p.placed_at, p.until)
    pairs = np.array(rk, dtype=np.int64).reshape(-1, 2)
    columns = np.array(times, dtype=np.float64).reshape(-1, 3)
    return (pairs[:, 0].copy(), pairs[:, 1].copy(), columns[:, 0].copy(), columns[:, 1].copy(),
            columns[:, 2].copy())


_ENTRY_COLUMNS: ByIdentity[tuple[np.ndarray, np.ndarray, int, np.ndarray, int]] = ByIdentity(64, weak=True)


def _entry_columns(entry: ModelEntry, names: tuple[str, ...], own: str,
                   ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, int]:
    """:func:`_column_spec` of ``entry``, remembered per entry object (hashing its feature names and task columns
    on every call cost more than the lookup). The entry is held weakly: a model replaced by a retrain, and the
    rows of snapshots gone by, are freed as soon as no snapshot refers to them."""
    return _ENTRY_COLUMNS.get(entry, (names, own), lambda: _column_spec(
        entry.feature_names, tuple(entry.task_columns.items()), names, own))


@functools.lru_cache(maxsize=1024)
def _column_spec(feature_names: tuple[str, ...], task_columns: tuple[tuple[str, int], ...], names: tuple[str, ...],
                 own: str) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, int]:
    """Where a model reads the running-pods counts (its columns, and each one's column of ``names``, -1: none),
    the column of the pod's own app (-1: none), the task columns left missing and the input size's column."""
    run_j = [j for j, n in enumerate(feature_names) if n.startswith(RUNNING_PREFIX)]
    run_c = [names.index(feature_names[j]) if feature_names[j] in names else -1 for j in run_j]
    own_j = feature_names.index(own) if own in feature_names else -1
    blank = [col for n, col in task_columns if n != TASK_INPUT]
    input_col = dict(task_columns).get(TASK_INPUT, -1)
    return (np.array(run_j, dtype=np.int64), np.array(run_c, dtype=np.int64), own_j,
            np.array(blank, dtype=np.int64), input_col)


@numba.njit(cache=True, nogil=True)
def _layout(counts: np.ndarray, model: np.ndarray, corr: np.ndarray, pod_r: np.ndarray, pod_k: np.ndarray,
            pod_mb: np.ndarray, pod_placed: np.ndarray, pod_until: np.ndarray, now: float,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows, group by group: per row its candidate row, input MB (NaN: unknown) and scale (the node's
    correction for the app times the pod's remaining share); the groups' bounds in those rows, and each
    group's app column and model index. The share is :meth:`AssumedPod.remaining`'s rule applied to the
    pods' times here (calling it once a pod doubled the Python part of the layout); the bit-for-bit test
    against the one-pod-at-a-time definition, which calls it, keeps the two the same.

    A pair (candidate row, app column) is one with pods counted there and a model; its rows are its assumed
    pods in the order given (newest first), as many as it counts, then pods with NaN and ``UNKNOWN_REMAINING``.
    """
    n_c, n_k = counts.shape
    pair_at = np.full((n_c, n_k), -1, dtype=np.int64)
    pair_r = np.empty(n_c * n_k, dtype=np.int64)
    pair_k = np.empty(n_c * n_k, dtype=np.int64)
    pods_of = np.empty(n_c * n_k, dtype=np.int64)
    starts = np.empty(n_c * n_k, dtype=np.int64)  # each pair's first row
    n_pairs = 0
    n_rows = 0
    for r in range(n_c):
        for k in range(n_k):
            if counts[r, k] > 0 and model[r, k] >= 0:
                pair_at[r, k] = n_pairs
                pair_r[n_pairs], pair_k[n_pairs] = r, k
                pods_of[n_pairs] = int(counts[r, k])
                starts[n_pairs] = n_rows
                n_rows += pods_of[n_pairs]
                n_pairs += 1
    filled = np.zeros(n_pairs, dtype=np.int64)
    mb = np.full(n_rows, np.nan)
    left = np.full(n_rows, UNKNOWN_REMAINING)
    for t in range(pod_r.size):
        q = pair_at[pod_r[t], pod_k[t]]
        if q < 0 or filled[q] >= pods_of[q]:
            continue
        row = starts[q] + filled[q]
        filled[q] += 1
        mb[row] = pod_mb[t]
        span = pod_until[t] - pod_placed[t]
        if np.isfinite(span) and span > 0:
            left[row] = min(1.0, max(0.0, (pod_until[t] - now) / span))
    # groups: (app column, model) in the order of their first pair
    group_k = np.empty(n_pairs, dtype=np.int64)
    group_m = np.empty(n_pairs, dtype=np.int64)
    group_of = np.empty(n_pairs, dtype=np.int64)
    group_rows = np.zeros(n_pairs + 1, dtype=np.int64)
    n_groups = 0
    for q in range(n_pairs):
        k, m = pair_k[q], model[pair_r[q], pair_k[q]]
        g = 0
        while g < n_groups and not (group_k[g] == k and group_m[g] == m):
            g += 1
        if g == n_groups:
            group_k[g], group_m[g] = k, m
            n_groups += 1
        group_of[q] = g
        group_rows[g + 1] += pods_of[q]
    bounds = np.cumsum(group_rows[:n_groups + 1])
    at = bounds[:n_groups].copy()
    row_r = np.empty(n_rows, dtype=np.int64)
    row_mb = np.empty(n_rows)
    scale = np.empty(n_rows)
    for q in range(n_pairs):
        g = group_of[q]
        c = corr[pair_r[q], pair_k[q]]
        for s in range(starts[q], starts[q] + pods_of[q]):
            row_r[at[g]] = pair_r[q]
            row_mb[at[g]] = mb[s]
            scale[at[g]] = c * left[s]
            at[g] += 1
    return row_r, row_mb, scale, bounds, group_k[:n_groups].copy(), group_m[:n_groups].copy()


@numba.njit(cache=True, nogil=True)
def _group_rows(matrix: np.ndarray, node_row: np.ndarray, priced_at: np.ndarray, row_r: np.ndarray,
                counts: np.ndarray, mb: np.ndarray, k: int, run_j: np.ndarray, run_c: np.ndarray, own_j: int,
                blank: np.ndarray, input_col: int) -> np.ndarray:
    """Two rows a pod for one group's model: its node's row of the model's matrix, the task's columns missing
    but the input size (the pod's), and the running-pods counts without the pod (it is not its own
    neighbour: its app's count less one), then with the new pod (its app's count plus one)."""
    n = row_r.size
    X = np.empty((2 * n, matrix.shape[1]), dtype=matrix.dtype)
    for t in range(n):
        r = row_r[t]
        src = matrix[node_row[priced_at[r]]]
        a, b = 2 * t, 2 * t + 1
        X[a, :] = src
        X[b, :] = src
        for c in blank:
            X[a, c] = np.nan
            X[b, c] = np.nan
        for u in range(run_j.size):
            j, c = run_j[u], run_c[u]
            v = 0.0 if c < 0 else counts[r, c]
            if c == k:
                v = v - 1.0
            X[a, j] = v
            X[b, j] = v + 1.0 if j == own_j else v
        if input_col >= 0:
            X[a, input_col] = mb[t]
            X[b, input_col] = mb[t]
    return X


@numba.njit(cache=True, nogil=True)
def _add_terms(out: np.ndarray, cand: np.ndarray, row_r: np.ndarray, pred: np.ndarray, scale: np.ndarray,
               weight: float) -> None:
    """``out[candidate] += weight · max(0, with − without) · scale`` row by row (a non-finite difference adds 0)."""
    for t in range(row_r.size):
        d = pred[2 * t + 1] - pred[2 * t]
        if not np.isfinite(d):
            d = 0.0
        elif d < 0.0:
            d = 0.0
        out[cand[row_r[t]]] += weight * d * scale[t]
