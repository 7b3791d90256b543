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
from app.scheduler.assumed import AssumedPods
from app.scheduler.snapshot import Snapshot

UNKNOWN_REMAINING = 0.5  # a running pod the scheduler did not place: half-way through, on average
TASK_INPUT = "task_input_size_mb"


def _pods(assumed: AssumedPods, node: str, now: float, exclude: str) -> dict[str, list[tuple[float, float]]]:
    """(input MB, remaining share) of the assumed pods per app on ``node``, newest first."""
    out: dict[str, list[tuple[float, float]]] = {}
    for p in reversed(assumed.on_node(node, now, exclude=exclude)):
        out.setdefault(p.app, []).append((p.input_mb, p.remaining(now)))
    return out


def inflicted_ms(snapshot: Snapshot, app: str, nodes: Sequence[str], at: np.ndarray, candidates: Sequence[int],
                 features: Sequence[Mapping[str, float]], assumed: AssumedPods, now: float, task_id: str,
                 weight: float) -> np.ndarray:
    """Per node of ``nodes``: the time (ms) a pod of ``app`` placed there adds to the pods running there.

    ``at``: the nodes' positions in ``snapshot.table``; ``candidates``: the indices to price (fresh nodes
    with something running); ``features``: each node's running-pods features.
    """
    out = np.zeros(len(nodes))
    if weight <= 0 or not candidates:
        return out
    own = RUNNING_PREFIX + app
    # (app b, model index) -> rows: (candidate, neighbour counts, input MB, scale)
    groups: dict[tuple[str, int], list[tuple[int, Mapping[str, float], float, float]]] = {}
    for i in candidates:
        counts = features[i]
        running = [(name[len(RUNNING_PREFIX):], int(c)) for name, c in counts.items() if c > 0]
        if not running:
            continue
        pods = _pods(assumed, nodes[i], now, task_id) if nodes[i] in assumed.nodes else {}
        for b, c in running:
            routes = snapshot.app_routes(b)
            m = -1 if routes is None else int(routes.model[at[i]])
            if routes is None or m < 0:
                continue
            corr = float(routes.correction[at[i]])
            mates = {**counts, RUNNING_PREFIX + b: counts[RUNNING_PREFIX + b] - 1.0}
            known = pods.get(b, [])[:c]
            rows = groups.setdefault((b, m), [])
            for mb, left in [*known, *[(math.nan, UNKNOWN_REMAINING)] * (c - len(known))]:
                rows.append((i, mates, mb, corr * left))
    for (b, m), rows in groups.items():
        routes = snapshot.app_routes(b)
        assert routes is not None  # noqa: S101 - grouped above only when present
        entry = routes.entries[m]
        X = entry.matrix[np.repeat(routes.row[at[[i for i, *_ in rows]]], 2)]
        input_col = entry.task_columns.get(TASK_INPUT)
        for name, col in entry.task_columns.items():
            if name != TASK_INPUT:
                X[:, col] = math.nan
        for j, name in enumerate(entry.feature_names):
            if not name.startswith(RUNNING_PREFIX):
                continue
            column = np.array([neighbours.get(name, 0.0) for _, neighbours, _, _ in rows], dtype=np.float64)
            X[0::2, j] = column  # without the pod
            X[1::2, j] = column + 1.0 if name == own else column  # with it
        if input_col is not None:
            X[:, input_col] = np.repeat([mb for _, _, mb, _ in rows], 2)
        pred = np.asarray(entry.predictor.predict(X), dtype=np.float64)
        delta = np.maximum(0.0, pred[1::2] - pred[0::2])
        delta[~np.isfinite(delta)] = 0.0
        np.add.at(out, [i for i, *_ in rows], weight * delta * np.array([s for *_, s in rows]))
    return out
