"""Filter and prioritize one pod over a snapshot: batched, never raises on missing data.

Per request (one pod, N candidate nodes):

1. A pod without the app label, no snapshot yet, a snapshot whose newest features are older than
   ``stale_after_s``, or candidates none of which has fresh data: a *neutral* answer — every node passes
   with score 5 (:data:`NEUTRAL_REASONS`).
2. Otherwise each fresh candidate gets a predicted RTT: one ``predict`` call per model for all candidates
   that use it (the node's own model, else app × node class), or node-weights' own prediction when no
   model covers the node. Stale or unknown nodes get no prediction: they pass and score neutral (stale: older
   than ``stale_after_s``, node-weights' ``stale``, or a metric group marked stale in node-features).
   Each fresh candidate also gets the task's *running-pods* features, one per known app
   (``running_pods_<app>``, :func:`running_features`): the pods of that app the scheduler believes run on the
   node — per app the larger of the running-apps view and the node's assumed pods not yet expected to have
   finished (placed after the view was read, less the scrape delay, when the view says when it was read).
   A model whose ``feature_names`` hold such a column gets the node's value; other columns of these names
   do not exist for it (old models are unaffected). The values go out with the predictions,
   so the training samples carry what the model saw.
3. Each prediction is multiplied by the node's residual correction for the app (node-weights
   ``correction``, :mod:`app.drift.residual`): what rtt-predictions carries, with the factor itself.
   It is then inflated for assumed pods the node's metrics cannot show yet (contention penalty).
4. Filter: anti-affinity, then SLA. When SLA alone would reject every remaining candidate and the policy
   says ``sla_when_all_fail: pass``, nobody fails on SLA (``sla_relaxed``).
5. Cost: the (corrected, inflated) prediction plus, weighted by the policy's ``objective.inflicted``, the
   time the models predict the pod adds to the pods already running on the node
   (:func:`app.scheduler.inflict.inflicted_ms`; ``Decision.inflicted_ms``). Scores:
   :func:`app.scheduler.scoring.score_nodes` of the cost with each node's credibility.
6. Exploration (:mod:`app.scheduler.explore`): when the pod is one of the share that may explore and a
   passing candidate is not yet learnt for the app, that node is the winner (``Decision.explored``;
   without a prediction there, it is expected to run as long as the slowest candidate's prediction);
   otherwise the winner is the top-scored passing node with a prediction, the lowest cost and then the
   highest credibility breaking ties.
   When another node has the winner's score (or more, for an explored node), the winner gets one more,
   or, at the top of the range, every other node gets at most one less: kube-scheduler then places the
   pod where the extender assumes it goes (:meth:`Decision.best`), not on a node tied with it.

The one side effect: the candidates' predicted RTTs are noted in the assumed pods
(:meth:`AssumedPods.expect`), so that placing the pod afterwards knows how long it is expected to run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType

import numpy as np

from app.features.vector import RUNNING_PREFIX
from app.scheduler.assumed import AssumedPod, AssumedPods
from app.scheduler.explore import chosen_to_explore, explored, not_learnt
from app.scheduler.filtering import anti_affinity_reason, contention_factor, sla_reason
from app.scheduler.inflict import inflicted_ms
from app.scheduler.memo import ByIdentity
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import Policy
from app.scheduler.scoring import MAX_SCORE, MIN_SCORE, NEUTRAL_SCORE, score_nodes
from app.scheduler.snapshot import ModelEntry, Snapshot
from app.scheduler.table import AppRoutes, model_groups

NO_APP = "no_app_label"
NOT_READY = "not_ready"
STALE_SNAPSHOT = "stale_snapshot"
STALE_NODES = "stale_nodes"
NEUTRAL_REASONS = (NO_APP, NOT_READY, STALE_SNAPSHOT, STALE_NODES)
STALE_REASONS = frozenset((NOT_READY, STALE_SNAPSHOT, STALE_NODES))
_NO_FEATURES: Mapping[str, float] = {}
_NO_COUNTS: Mapping[str, int] = {}


@dataclasses.dataclass(frozen=True)
class DecideParams:
    policy: Policy = dataclasses.field(default_factory=Policy)
    credibility_prior: float = 0.5
    stale_after_s: float = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One candidate's outcome. ``predicted_rtt_ms`` is the model's prediction, without the contention penalty
    (what rtt-predictions carries, so the feedback loop judges the model, not the penalty); NaN: none."""

    node: str
    score: int = NEUTRAL_SCORE
    predicted_rtt_ms: float = math.nan
    model_key: str | None = None
    model_version: int | None = None
    credibility: float = math.nan
    failed: str | None = None
    stale: bool = False
    features: Mapping[str, float] = dataclasses.field(default_factory=dict)  # per-candidate task features
    correction: float = 1.0  # residual factor included in predicted_rtt_ms


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome for all candidates, column by column (cheap to build on the request path).

    ``rtt_ms`` includes the residual correction and the contention penalty (NaN: no prediction); ``failed``
    holds reasons (None: passes); ``features`` the task features of each candidate (``running_pods_<app>``;
    empty for a node without fresh data; candidates with nothing running share one map, and so do candidates
    whose only pods are assumed ones with the same counts: read them, never change them).
    """

    pod: PodInfo
    nodes: tuple[str, ...]
    score: list[int]
    rtt_ms: list[float] = dataclasses.field(default_factory=list)
    model_key: list[str | None] = dataclasses.field(default_factory=list)
    model_version: list[int | None] = dataclasses.field(default_factory=list)
    credibility: list[float] = dataclasses.field(default_factory=list)
    failed: list[str | None] = dataclasses.field(default_factory=list)
    fresh: list[bool] = dataclasses.field(default_factory=list)
    model_rtt_ms: list[float] = dataclasses.field(default_factory=list)  # before the contention penalty
    features: list[Mapping[str, float]] = dataclasses.field(default_factory=list)  # running pods per candidate
    neutral: str | None = None  # one of NEUTRAL_REASONS, None for a scored answer
    sla_relaxed: bool = False
    correction: list[float] = dataclasses.field(default_factory=list)  # residual factor per candidate
    explored: str | None = None  # the candidate this pod explores (app/scheduler/explore.py)
    inflicted_ms: list[float] = dataclasses.field(default_factory=list)  # added to running pods (inflict.py)
    winner: int | None = None  # index of :meth:`best`'s node when :func:`decide` found one (None: look it up)

    @property
    def stale(self) -> bool:
        return self.neutral in STALE_REASONS

    @functools.cached_property
    def verdicts(self) -> tuple[NodeVerdict, ...]:
        return tuple(self.verdict(i) for i in range(len(self.nodes)))

    def verdict(self, i: int) -> NodeVerdict:
        """The outcome of candidate ``i``."""
        n = self.nodes[i]
        if self.neutral is not None:
            return NodeVerdict(n, stale=self.stale)
        return NodeVerdict(n, self.score[i], (self.model_rtt_ms or self.rtt_ms)[i], self.model_key[i],
                           self.model_version[i], self.credibility[i], self.failed[i], not self.fresh[i],
                           self.features[i] if self.features else _NO_FEATURES,
                           self.correction[i] if self.correction else 1.0)

    def failed_nodes(self) -> dict[str, str]:
        if self.neutral is not None:
            return {}
        return {n: f for n, f in zip(self.nodes, self.failed, strict=True) if f is not None}

    def passed(self) -> list[str]:
        if self.neutral is not None:
            return list(self.nodes)
        return [n for n, f in zip(self.nodes, self.failed, strict=True) if f is None]

    def scores(self) -> list[tuple[str, int]]:
        return list(zip(self.nodes, self.score, strict=True))

    def predicted(self) -> list[NodeVerdict]:
        """Candidates with a usable prediction."""
        return [v for v in self.verdicts if math.isfinite(v.predicted_rtt_ms)]

    def published(self) -> list[NodeVerdict]:
        """What rtt-predictions carries: every fresh candidate of a scored answer, with its task features and
        its prediction (NaN: no model covers it yet — the features still make its training sample complete)."""
        return [v for v in self.verdicts if not v.stale] if self.neutral is None else []

    def best(self) -> str | None:
        """The explored node, else the top-scored passing node with a prediction (lowest cost — RTT plus the
        inflicted slowdown — then highest credibility break ties); None when neutral."""
        if self.neutral is not None:
            return None
        if self.explored is not None:
            return self.explored
        if self.winner is not None:
            return self.nodes[self.winner]
        ok = [i for i, f in enumerate(self.failed) if f is None and math.isfinite(self.rtt_ms[i])]
        if not ok:
            return None
        extra = self.inflicted_ms or [0.0] * len(self.nodes)
        return self.nodes[min(ok, key=lambda i: (-self.score[i], self.rtt_ms[i] + extra[i], -self.credibility[i]))]


def neutral(pod: PodInfo, nodes: Sequence[str], reason: str) -> Decision:
    """Everyone passes with the neutral score."""
    return Decision(pod, tuple(nodes), [NEUTRAL_SCORE] * len(nodes), neutral=reason)


def known_apps(snapshot: Snapshot, assumed: AssumedPods, app: str) -> tuple[str, ...]:
    """Apps that get a running-pods feature: the pod's, every modelled app and every app ever placed (sorted).

    >>> known_apps(Snapshot.empty(now=0.0), AssumedPods(), "gCTF")
    ('gCTF',)
    """
    return _known_apps(app, assumed.apps, tuple(snapshot.models))


@functools.lru_cache(maxsize=256)
def _known_apps(app: str, placed: tuple[str, ...], model_keys: tuple[str, ...]) -> tuple[str, ...]:
    apps = {app, *placed}
    apps.update(key.split(":", 1)[0] for key in model_keys)
    return tuple(sorted(apps))


def running_features(apps: Sequence[str], running: Mapping[str, int], placed: Mapping[str, int]) -> dict[str, float]:
    """``running_pods_<app>`` for each of ``apps``: the larger of the running-apps view and the assumed pods.

    Both count the same pods once the view catches up with a placement, so each is a lower bound.

    >>> running_features(("Motioncor2", "gCTF"), {"gCTF": 2}, {"gCTF": 1, "Motioncor2": 1})
    {'running_pods_Motioncor2': 1.0, 'running_pods_gCTF': 2.0}
    """
    return {name: float(max(running.get(a, 0), placed.get(a, 0))) for name, a in _running_names(tuple(apps))}


@functools.lru_cache(maxsize=256)
def _running_names(apps: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((RUNNING_PREFIX + a, a) for a in apps)


@functools.lru_cache(maxsize=256)
def _idle(apps: tuple[str, ...]) -> Mapping[str, float]:
    """:func:`running_features` of a node with nothing running, one read-only map per tuple of apps."""
    return MappingProxyType(running_features(apps, _NO_COUNTS, _NO_COUNTS))


@functools.lru_cache(maxsize=1024)
def _running_columns(feature_names: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    return tuple((j, n) for j, n in enumerate(feature_names) if n.startswith(RUNNING_PREFIX))



def decide(
    snapshot: Snapshot | None, pod: PodInfo, nodes: Sequence[str], assumed: AssumedPods,
    params: DecideParams, now: float, *, note_expected: bool = True, remember_rows: bool = True,
) -> Decision:
    """Predict, filter and score ``nodes`` for ``pod``; see the module docstring for the rule.

    Per-node state is gathered from the snapshot's column views (:mod:`app.scheduler.table`), once per snapshot
    and node list (:meth:`Snapshot.candidates`: the gathers, the candidates each model covers, the oldest data);
    per request only the staleness test runs (one comparison when every candidate has data), and Python loops
    run only over candidates with something on them (running or assumed pods) and over model groups.
    ``note_expected=False`` leaves the assumed pods untouched (an explanation, not a scheduling cycle).
    ``remember_rows=False``: no later call is expected for this pod on these nodes (kube-scheduler's
    prioritize comes after its filter), so the predictor need not remember the rows (``Predictor.predict``).
    """
    app = pod.app
    if app is None:
        return neutral(pod, nodes, NO_APP)
    if snapshot is None:
        return neutral(pod, nodes, NOT_READY)
    if snapshot.age(now) > params.stale_after_s:
        return neutral(pod, nodes, STALE_SNAPSHOT)
    n = len(nodes)
    table = snapshot.table
    if not len(table):
        return neutral(pod, nodes, STALE_NODES)
    names = nodes if isinstance(nodes, tuple) else tuple(nodes)
    c = snapshot.candidates(app, names, params.credibility_prior)
    at, known, ts = c.at, c.known, c.features_ts
    every = c.all_data and now - c.oldest_ts <= params.stale_after_s  # every candidate fresh (the usual case)
    if every:
        fresh = c.has_data
    else:
        fresh = c.has_data & (now - ts <= params.stale_after_s)  # not is_stale
        if not fresh.any():
            return neutral(pod, nodes, STALE_NODES)
        every = bool(fresh.all())
    cred = c.credibility
    states = snapshot.nodes
    policy = params.policy
    task_id = pod.task_id
    routes = c.routes
    model = c.model if every else np.where(fresh, c.model, -1)
    corr = c.correction if every else np.where(fresh, c.correction, 1.0)
    samples = c.samples
    # running pods per candidate: the running-apps view, or the assumed pods placed since it was current (its stamp)
    by_node = assumed.nodes
    placed = _placed(by_node, nodes, c.index) if by_node else None
    busy_now = c.busy if placed is None else c.busy | placed  # something runs there (or was placed there)
    busy = fresh & busy_now
    apps = known_apps(snapshot, assumed, app)
    idle = _idle(apps)  # shared by every node with nothing running (read-only)
    features: list[Mapping[str, float]] = [idle] * n if every else [idle if f else _NO_FEATURES for f in fresh.tolist()]
    in_flight = np.zeros(n)  # pods of ``app`` counted as running on each candidate
    pending_on: dict[int, tuple[str, ...]] = {}
    live_on: dict[int, tuple[AssumedPod, ...]] = {}  # assumed pods not expected to have finished, per candidate
    own_key = RUNNING_PREFIX + app
    running_on: list[int] = []  # candidates given running-pods features of their own (in order)
    busy_at = np.flatnonzero(busy)
    if busy_at.size:  # the columns these candidates read, gathered at once (the same numbers one by one gives)
        delay, scan = policy.scrape_delay_s, assumed.scan
        shared: dict[tuple[tuple[str, int], ...], Mapping[str, float]] = {}  # same counts, one map (read-only)
        for i, is_known, read_at, features_ts, was_placed in zip(
                busy_at.tolist(), known[busy_at].tolist(), table.running_ts[at[busy_at]].tolist(), ts[busy_at].tolist(),
                placed[busy_at].tolist() if placed is not None else [False] * busy_at.size, strict=True):
            name = nodes[i]
            running = states[name].running if is_known else _NO_COUNTS
            if not is_known:
                read_at = 0.0
            since = read_at - delay if read_at > 0 else -math.inf
            counts: Mapping[str, int] = _NO_COUNTS
            pending: tuple[str, ...] = ()
            if was_placed:
                counts, pending, live_on[i] = scan(name, now, features_ts, task_id, since)
            if running:
                features[i] = running_features(apps, running, counts)
                running_on.append(i)
            elif counts:  # the usual case: only assumed pods
                key = tuple(counts.items())
                same = shared.get(key)
                if same is None:
                    same = shared[key] = running_features(apps, _NO_COUNTS, counts)
                features[i] = same
                running_on.append(i)
            if pending:
                pending_on[i] = pending
        if running_on:
            in_flight[running_on] = [features[i][own_key] for i in running_on]
    rtt = np.full(n, np.nan)
    keys: list[str | None] = [None] * n
    versions: list[int | None] = [None] * n
    if routes is not None:
        _predict(routes, c.groups if every else model_groups(model, c.row), pod.task_features(), features, idle, rtt,
                 keys, versions, remember_rows)
        own = fresh & (model < 0)
        rtt[own] = c.predicted[own]  # no model covers the node: node-weights' own prediction
    rtt *= corr
    model_rtt = rtt.copy()
    if pending_on:  # nodes with the same pending apps share their factor (remembered per policy and app)
        factors = _factors(policy, app)
        by: list[float] = []
        for apps_pending in pending_on.values():
            f = factors.get(apps_pending)
            if f is None:
                if len(factors) >= MAX_FACTORS:
                    factors.clear()
                f = factors[apps_pending] = contention_factor(app, apps_pending, policy)
            by.append(f)
        rtt[list(pending_on)] *= by
    failed: list[str | None] = [None] * n
    if policy.anti_affinity:
        for i in np.flatnonzero(busy_now).tolist():  # an empty node never interferes
            name = nodes[i]
            st = states.get(name)
            on = live_on[i] if i in live_on else assumed.on_node(name, now, exclude=task_id)  # scanned: the same
            failed[i] = anti_affinity_reason(app, st.running if st else _NO_COUNTS, (p.app for p in on), policy)
    relaxed = _apply_sla(app, policy, rtt, fresh, failed)
    usable = fresh & np.isfinite(rtt) & (rtt > 0)
    rtt = np.where(usable, rtt, np.nan)
    priced = [i for i in running_on if usable[i]]  # busy, with a usable prediction and something running
    inflicted = inflicted_ms(snapshot, app, nodes, at, priced, features, live_on, now,
                             policy.inflicted_weight) if priced and policy.inflicted_weight > 0 else None
    cost = rtt if inflicted is None else rtt + inflicted
    scores = score_nodes(cost, cred)
    passing = np.ones(n, dtype=bool) if failed.count(None) == n else np.array([f is None for f in failed], dtype=bool)
    e = None
    if chosen_to_explore(task_id, policy.explore_share):  # one of the pods that may explore: is a node unlearnt?
        unlearnt = not_learnt(fresh & passing, model >= 0, samples, in_flight, policy.explore_min_samples)
        e = explored(task_id, nodes, unlearnt, samples, share=policy.explore_share)
    expected = rtt
    if e is not None and not usable[e] and usable.any():  # unknown there: as long as the slowest prediction
        expected = rtt.copy()
        expected[e] = np.nanmax(rtt)
    if note_expected:
        assumed.expect(task_id, nodes, expected.tolist())  # how long a placement runs (AssumedPods.assume)
    winner = e
    if winner is None:
        ok = np.flatnonzero(passing & usable)
        if ok.size:
            top = ok[scores[ok] == scores[ok].max()]  # of these: the lowest cost, then the most credible
            winner = int(top[0] if top.size == 1 else top[np.lexsort((-cred[top], cost[top]))[0]])
    if winner is not None and n > 1:
        own, scores[winner] = scores[winner], MIN_SCORE - 1
        rest = int(scores.max())  # the highest score of the others
        scores[winner] = own
        if scores[winner] <= rest:  # tied (or explored below others): make the winner the only top
            if rest < MAX_SCORE:
                scores[winner] = rest + 1
            else:
                scores = np.minimum(scores, MAX_SCORE - 1)
                scores[winner] = MAX_SCORE
    return Decision(
        pod, names, scores.tolist(), rtt.tolist(), keys, versions, cred.tolist(), failed,
        fresh.tolist(), np.where(usable, model_rtt, np.nan).tolist(), features, sla_relaxed=relaxed,
        correction=corr.tolist(), explored=nodes[e] if e is not None else None, winner=winner,
        inflicted_ms=inflicted.tolist() if inflicted is not None else [],
    )


_FACTORS: ByIdentity[dict[tuple[str, ...], float]] = ByIdentity(64)  # per (policy, app); a policy is held
MAX_FACTORS = 1024  # pending-apps tuples remembered per policy and app


def _factors(policy: Policy, app: str) -> dict[tuple[str, ...], float]:
    """The contention factors of ``app`` under ``policy`` met so far, by pending apps (a policy is immutable)."""
    return _FACTORS.get(policy, app, dict)


def _placed(by_node: Collection[str], nodes: Sequence[str], index: Callable[[], Mapping[str, int]]) -> np.ndarray:
    """Per candidate: some placement is remembered on it (``by_node``: :attr:`AssumedPods.nodes`; ``index()``:
    each name's place in ``nodes``), looked up from whichever of the two is smaller."""
    n = len(nodes)
    if len(by_node) <= n:  # no more placed nodes than candidates: each looked up in the list's index (made once)
        where = index()
        if len(where) == n:  # (a name listed twice: every place is looked up below)
            placed = np.zeros(n, dtype=bool)
            at = [i for i in map(where.get, by_node) if i is not None]
            if at:
                placed[at] = True
            return placed
    return np.array([name in by_node for name in nodes], dtype=bool)


def _predict(
    routes: AppRoutes, groups: Sequence[tuple[int, np.ndarray, list[int], np.ndarray]], task: Mapping[str, float],
    features: list[Mapping[str, float]], idle: Mapping[str, float], rtt: np.ndarray,
    keys: list[str | None], versions: list[int | None], remember: bool = True,
) -> None:
    """One ``predict`` per model over the candidates it covers (``groups``:
    :func:`~app.scheduler.table.model_groups`); fills ``rtt``, ``keys`` and ``versions``."""
    for m, sel, picked, rows in groups:
        entry = routes.entries[m]
        X = model_rows(entry, rows, task, [features[i] for i in picked], idle)
        rtt[sel] = np.asarray(entry.predictor.predict(X, remember=remember), dtype=np.float64)
        if len(picked) == len(keys):  # one model covers every candidate
            keys[:], versions[:] = [entry.key] * len(keys), [entry.version] * len(keys)
        else:
            for i in picked:
                keys[i], versions[i] = entry.key, entry.version


def model_rows(entry: ModelEntry, rows: np.ndarray, task: Mapping[str, float],
               features: Sequence[Mapping[str, float]], idle: Mapping[str, float]) -> np.ndarray:
    """The rows ``entry``'s model sees for candidates at ``rows`` of its matrix: node features, the task's
    features and each candidate's running-pods ``features`` (``idle`` when nothing runs there)."""
    X = entry.matrix[rows]
    for name, col in entry.task_columns.items():
        X[:, col] = task.get(name, math.nan)
    columns = _running_columns(entry.feature_names)
    busy = [k for k, f in enumerate(features) if f is not idle] if columns else []
    for j, running in columns:
        X[:, j] = idle.get(running, math.nan)
        for k in busy:
            X[k, j] = features[k].get(running, math.nan)
    return X


def _apply_sla(app: str, policy: Policy, rtt: np.ndarray, fresh: np.ndarray, failed: list[str | None]) -> bool:
    """Fail fresh candidates over the app's SLA (in place); True when the policy let them all pass instead."""
    sla = policy.sla(app)
    if sla is None:
        return False
    with np.errstate(invalid="ignore"):
        over = fresh & np.isfinite(rtt) & (rtt > sla)
    missing = [i for i in np.flatnonzero(over).tolist() if failed[i] is None]
    remaining = failed.count(None)
    if remaining and len(missing) == remaining and policy.sla_when_all_fail == "pass":
        return True
    for i in missing:
        failed[i] = sla_reason(app, float(rtt[i]), policy)
    return False
