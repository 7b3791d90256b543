"""Column views of a snapshot, so that a decision over N candidates is a few array gathers, not N loops.

:class:`NodeTable` gives every node of the view a position and keeps, per position, what a decision reads
of every candidate: the features timestamp, the credibility (NaN: never evaluated), whether its data are
stale (node-weights say so, or its node-features mark a metric group stale: a hung GPU's zeros, an
exporter that did not answer), whether the running-apps view shows anything on the node and when that view
was read. :class:`AppRoutes` gives, per position, the model that predicts an app there — the node's own model
when it covers the node, else the app × node class model, as
:meth:`~app.scheduler.snapshot.Snapshot.model_for` decides — and the node's row in that model's matrix, plus
what node-weights say of the app there: its own prediction, the residual correction
(:mod:`app.drift.residual`) and how many of the app's tasks the node completed. A
request turns its candidate names into positions (one dict lookup each) and gathers (:class:`Candidates`);
the snapshot keeps the gathers of its last few node lists, since kube-scheduler sends the same list pod after
pod.

Both are built off the request path by :class:`~app.scheduler.builder.SnapshotBuilder`, in steps
(:func:`node_table_steps`) so that a view of thousands of nodes never holds the event loop for long.

>>> from app.scheduler.entries import NodeState
>>> t = build_node_table({"a": NodeState("a", features_ts=5.0, weight=0.5), "b": NodeState("b", running={"x": 1})})
>>> dict(t.pos), t.features_ts.tolist(), t.busy.tolist()
({'a': 0, 'b': 1}, [5.0, 0.0], [False, True])
>>> t.weight.tolist()
[0.5, nan]
>>> from types import MappingProxyType as M
>>> nodes = {"a": NodeState("a", correction=M({"gCTF": 2.0}), samples=M({"gCTF": 7})), "b": NodeState("b")}
>>> r = build_app_routes("gCTF", build_node_table(nodes), {}, nodes)
>>> r.model.tolist(), r.correction.tolist(), r.samples.tolist()
([-1, -1], [2.0, 1.0], [7, 0])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Mapping
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from app.contracts.keys import parse_model_key
from app.scheduler.entries import ModelEntry, NodeState

T = TypeVar("T")
CHUNK = 128  # nodes handled between two yields of a build in steps


@dataclasses.dataclass(frozen=True, slots=True)
class NodeTable:
    """Per-node columns of a snapshot, indexed by the positions in :attr:`pos`."""

    pos: Mapping[str, int]  # node -> position
    features_ts: np.ndarray  # float64, 0 until node-features arrived
    weight: np.ndarray  # float64 credibility, NaN when never evaluated
    stale: np.ndarray  # bool: node-weights say stale, or node-features mark a metric group stale
    busy: np.ndarray  # bool: the running-apps view shows pods on the node
    running_ts: np.ndarray  # float64: up to when the running-apps view shows the pods placed (0: unknown)

    def __len__(self) -> int:
        return len(self.pos)


@dataclasses.dataclass(frozen=True, slots=True)
class AppRoutes:
    """Which model predicts one app on each node position, at which row of its matrix, and node-weights' word."""

    entries: tuple[ModelEntry, ...]
    model: np.ndarray  # int64 index into ``entries`` per position; -1 when no model covers the node
    row: np.ndarray  # int64 row of the node in ``entries[model].matrix``
    predicted: np.ndarray  # float64 node-weights' own prediction for the app (NaN: none)
    correction: np.ndarray  # float64 residual factor for the app (1: none)
    samples: np.ndarray  # int64 tasks of the app the node completed (node-weights ``samples``)


@dataclasses.dataclass(frozen=True, slots=True)
class Candidates:
    """What a decision gathers for one list of candidate names and one app, computed once per snapshot
    (:meth:`~app.scheduler.snapshot.Snapshot.candidates`): kube-scheduler sends the same node list pod after
    pod, so a request reuses the gathers of the previous one. Arrays are read-only; a name the view does not
    know has ``known`` False and position 0 (whatever is gathered there is masked by ``known``)."""

    at: np.ndarray  # int64 positions in the table (0 for unknown names)
    known: np.ndarray  # bool
    features_ts: np.ndarray  # float64
    has_data: np.ndarray  # bool: known, not stale (:attr:`NodeTable.stale`), node-features received (fresh once recent)
    credibility: np.ndarray  # float64: the node's weight, else the prior
    busy: np.ndarray  # bool: known and the running-apps view shows pods on it
    routes: AppRoutes | None
    model: np.ndarray  # int64 index into ``routes.entries`` (-1: none, or no routes)
    row: np.ndarray  # int64 row in that model's matrix
    predicted: np.ndarray  # float64 node-weights' own prediction (NaN: none)
    correction: np.ndarray  # float64 residual factor (1: none)
    samples: np.ndarray  # int64 completed tasks of the app on the node (0 for unknown names)
    oldest_ts: float  # the oldest features timestamp of a node with data (inf: none has data)
    all_data: bool  # every candidate has data (``has_data`` all True)
    groups: tuple[tuple[int, np.ndarray, list[int], np.ndarray], ...]  # per model covering some candidate
    # (index into ``routes.entries``, their positions, the same as a list, their rows), in model order
    nodes: tuple[str, ...] = ()
    _index: list[Mapping[str, int]] = dataclasses.field(default_factory=list, repr=False, compare=False)

    def index(self) -> Mapping[str, int]:
        """Name -> its place in the list (the first, for a name listed twice); made on first use."""
        if not self._index:
            self._index.append(MappingProxyType({name: i for i, name in reversed(list(enumerate(self.nodes)))}))
        return self._index[0]


def model_groups(model: np.ndarray, rows: np.ndarray) -> list[tuple[int, np.ndarray, list[int], np.ndarray]]:
    """Per model covering some candidate, in model order: (its index, the candidates' positions, the same as a
    list, their rows); ``model`` -1: no model there.

    >>> [(m, picked, r.tolist()) for m, _, picked, r in model_groups(np.array([1, -1, 0, 1]), np.arange(4) * 10)]
    [(0, [2], [20]), (1, [0, 3], [0, 30])]
    """
    covered = model[model >= 0]
    if not covered.size:
        return []
    first = int(covered[0])
    out = []
    for m in [first] if (covered == first).all() else np.unique(covered).tolist():  # usually one model
        sel = np.flatnonzero(model == m)
        out.append((m, sel, sel.tolist(), rows[sel]))
    return out


def gather_candidates(table: NodeTable, routes: AppRoutes | None, nodes: tuple[str, ...],
                      prior: float) -> Candidates:
    """:class:`Candidates` of ``nodes`` over ``table`` and ``routes`` (the app's; None: no model, no word),
    with ``prior`` as the credibility of a node never evaluated."""
    n = len(nodes)
    get = table.pos.get
    at = np.array([get(name, -1) for name in nodes], dtype=np.int64).reshape(n)
    known = at >= 0
    at[~known] = 0
    ts = table.features_ts[at]
    weight = table.weight[at]
    if routes is not None:
        model, row, predicted = routes.model[at], routes.row[at], routes.predicted[at]
        correction, samples = routes.correction[at], np.where(known, routes.samples[at], 0)
    else:
        model, row, predicted = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, math.nan)
        correction, samples = np.ones(n), np.zeros(n, dtype=np.int64)
    has_data = known & ~table.stale[at] & (ts > 0)
    groups = model_groups(model, row)
    out = Candidates(
        at=at, known=known, features_ts=ts, has_data=has_data,
        credibility=np.where(known & ~np.isnan(weight), weight, prior), busy=known & table.busy[at],
        routes=routes, model=model, row=row, predicted=predicted, correction=correction, samples=samples,
        oldest_ts=float(ts[has_data].min()) if has_data.any() else math.inf, all_data=bool(has_data.all()),
        groups=tuple(groups), nodes=nodes,
    )
    for field in dataclasses.fields(out):
        value = getattr(out, field.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    for _, sel, _, rows in groups:
        sel.flags.writeable = rows.flags.writeable = False
    return out


def node_table_steps(nodes: Mapping[str, NodeState]) -> Generator[None, None, NodeTable]:
    """Build the table of ``nodes``, yielding every :data:`CHUNK` nodes; the table is the return value.

    Each chunk's values are converted to arrays in its own step: they are float objects of states written
    at different times, scattered over the heap, and reading 5,000 of them at once took a millisecond.
    """
    states = list(nodes.values())
    names = list(nodes)
    n = len(states)
    ts, weight, running_ts = np.empty(n), np.empty(n), np.empty(n)
    stale, busy = np.empty(n, dtype=bool), np.empty(n, dtype=bool)
    pos: dict[str, int] = {}
    for start in range(0, n, CHUNK):
        chunk = states[start:start + CHUNK]
        end = start + len(chunk)
        ts[start:end] = [st.features_ts for st in chunk]
        weight[start:end] = [math.nan if st.weight is None else st.weight for st in chunk]
        stale[start:end] = [st.weights_stale or bool(st.stale_metrics) for st in chunk]
        busy[start:end] = [bool(st.running) for st in chunk]
        running_ts[start:end] = [st.running_ts for st in chunk]
        pos.update(zip(names[start:end], range(start, end), strict=True))
        yield
    return NodeTable(pos=MappingProxyType(pos), features_ts=ts, weight=weight, stale=stale, busy=busy,
                     running_ts=running_ts)


def build_node_table(nodes: Mapping[str, NodeState]) -> NodeTable:
    """:func:`node_table_steps` run to the end."""
    return run_steps(node_table_steps(nodes))


def apps_steps(
    models: Mapping[str, ModelEntry], nodes: Mapping[str, NodeState],
) -> Generator[None, None, frozenset[str]]:
    """Apps with a model in ``models`` or named by a node's node-weights (prediction, correction, samples),
    yielding every :data:`CHUNK` nodes."""
    apps = {parse_model_key(key)[0] for key in models}
    states = list(nodes.values())
    for start in range(0, len(states), CHUNK):
        for st in states[start:start + CHUNK]:
            apps.update(st.predicted_rtt_ms)
            apps.update(st.correction)
            apps.update(st.samples)
        yield
    return frozenset(apps)


def apps_of(models: Mapping[str, ModelEntry], nodes: Mapping[str, NodeState]) -> frozenset[str]:
    """:func:`apps_steps` run to the end."""
    return run_steps(apps_steps(models, nodes))


def mentions(app: str, node: NodeState) -> bool:
    """Whether node-weights said anything of ``app`` on ``node`` (prediction, correction or samples)."""
    return app in node.predicted_rtt_ms or app in node.correction or app in node.samples


def app_routes_steps(
    app: str, table: NodeTable, models: Mapping[str, ModelEntry], nodes: Mapping[str, NodeState],
) -> Generator[None, None, AppRoutes]:
    """The routes and node-weights columns of ``app``, yielding every :data:`CHUNK` positions written."""
    shared: list[ModelEntry] = []
    own: list[ModelEntry] = []
    for key, entry in models.items():
        model_app, _, node = parse_model_key(key)
        if model_app == app and entry.row_index:
            (own if node is not None else shared).append(entry)
    n = len(table)
    model = np.full(n, -1, dtype=np.int64)
    row = np.zeros(n, dtype=np.int64)
    predicted = np.full(n, math.nan)
    correction = np.ones(n)
    samples = np.zeros(n, dtype=np.int64)
    states = list(nodes.values())
    for start in range(0, n, CHUNK):
        for i in range(start, min(start + CHUNK, n)):
            st = states[i]
            if mentions(app, st):
                predicted[i] = st.predicted_rtt_ms.get(app, math.nan)
                c = st.correction.get(app, 1.0)
                correction[i] = c if c > 0 else 1.0
                samples[i] = st.samples.get(app, 0)
        yield
    pos = table.pos
    for m, entry in enumerate((*shared, *own)):  # a node's own model overrides the class model
        names = list(entry.row_index)
        for start in range(0, len(names), CHUNK):
            chunk = names[start:start + CHUNK]
            at = [pos[name] for name in chunk]
            model[at] = m
            row[at] = [entry.row_index[name] for name in chunk]
            yield
    return AppRoutes(entries=(*shared, *own), model=model, row=row, predicted=predicted, correction=correction,
                     samples=samples)


def build_app_routes(app: str, table: NodeTable, models: Mapping[str, ModelEntry],
                     nodes: Mapping[str, NodeState]) -> AppRoutes:
    """:func:`app_routes_steps` run to the end."""
    return run_steps(app_routes_steps(app, table, models, nodes))


def run_steps(steps: Generator[None, None, T]) -> T:
    """Run a build in steps to its end and return its result (for callers that need no slicing)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
