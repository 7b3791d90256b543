"""Filter and prioritize one pod over a snapshot: batched, never raises on missing data.

Per request (one pod, N candidate nodes):

1. A pod without the app label, no snapshot yet, a snapshot whose newest features are older than
   ``stale_after_s``, or candidates none of which has fresh data: a *neutral* answer — every node passes
   with score 5 (:data:`NEUTRAL_REASONS`).
2. Otherwise each fresh candidate gets a predicted RTT: one ``predict`` call per model for all candidates
   that use it (the node's own model, else app × node class), or node-weights' own prediction when no
   model covers the node. Stale or unknown nodes get no prediction: they pass and score neutral.
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
5. Scores: :func:`app.scheduler.scoring.score_nodes` with each node's credibility.
6. Exploration (:mod:`app.scheduler.explore`): when the pod is one of the share that may explore and a
   passing candidate is not yet learnt for the app, that node is the winner (``Decision.explored``;
   without a prediction there, it is expected to run as long as the slowest candidate's prediction);
   otherwise the winner is the top-scored passing node with a prediction, the lowest RTT breaking ties.
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
from collections.abc import Mapping, Sequence

import numpy as np

from app.features.vector import RUNNING_PREFIX
from app.scheduler.assumed import AssumedPods
from app.scheduler.explore import explored, not_learnt
from app.scheduler.filtering import anti_affinity_reason, contention_factor, sla_reason
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import Policy
from app.scheduler.scoring import MAX_SCORE, NEUTRAL_SCORE, score_nodes
from app.scheduler.snapshot import Snapshot
from app.scheduler.table import table_of

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

    ``rtt_ms`` includes the contention penalty (NaN: no prediction); ``failed`` holds reasons (None: passes).
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
    neutral: str | None = None  # one of NEUTRAL_REASONS, None for a scored answer
    sla_relaxed: bool = False
    correction: list[float] = dataclasses.field(default_factory=list)  # residual factor per candidate
    explored: str | None = None  # the candidate this pod explores (app/scheduler/explore.py)
    running: np.ndarray | None = dataclasses.field(default=None, repr=False)  # running pods per candidate x app
    running_apps: tuple[str, ...] = ()  # the apps of ``running``'s columns

    @functools.cached_property
    def features(self) -> list[Mapping[str, float]]:
        """Per candidate, its task features (``running_pods_<app>``; empty for a node without fresh data)."""
        if self.running is None:
            return [_NO_FEATURES] * len(self.nodes)
        names = [RUNNING_PREFIX + a for a in self.running_apps]
        return [dict(zip(names, row, strict=True)) if fresh else _NO_FEATURES
                for row, fresh in zip(self.running.tolist(), self.fresh, strict=True)]

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
        features: Mapping[str, float] = _NO_FEATURES
        if "features" in self.__dict__:
            features = self.features[i]
        elif self.running is not None and self.fresh[i]:
            names = [RUNNING_PREFIX + a for a in self.running_apps]
            features = dict(zip(names, self.running[i].tolist(), strict=True))
        return NodeVerdict(n, self.score[i], (self.model_rtt_ms or self.rtt_ms)[i], self.model_key[i],
                           self.model_version[i], self.credibility[i], self.failed[i], not self.fresh[i],
                           features, self.correction[i] if self.correction else 1.0)

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
        """The explored node, else the top-scored passing node with a prediction (lowest RTT breaks ties);
        None when neutral."""
        if self.neutral is not None:
            return None
        if self.explored is not None:
            return self.explored
        ok = [i for i, f in enumerate(self.failed) if f is None and math.isfinite(self.rtt_ms[i])]
        if not ok:
            return None
        return self.nodes[min(ok, key=lambda i: (-self.score[i], self.rtt_ms[i]))]


def neutral(pod: PodInfo, nodes: Sequence[str], reason: str) -> Decision:
    """Everyone passes with the neutral score."""
    return Decision(pod, tuple(nodes), [NEUTRAL_SCORE] * len(nodes), neutral=reason)


def known_apps(snapshot: Snapshot, assumed: AssumedPods, app: str) -> tuple[str, ...]:
    """Apps that get a running-pods feature: the pod's, every modelled app and every app ever placed (sorted).

    >>> known_apps(Snapshot.empty(now=0.0), AssumedPods(), "gCTF")
    ('gCTF',)
    """
    apps = {app, *assumed.apps}
    apps.update(key.split(":", 1)[0] for key in snapshot.models)
    return tuple(sorted(apps))


def running_features(apps: Sequence[str], running: Mapping[str, int], placed: Mapping[str, int]) -> dict[str, float]:
    """``running_pods_<app>`` for each of ``apps``: the larger of the running-apps view and the assumed pods.

    Both count the same pods once the view catches up with a placement, so each is a lower bound.

    >>> running_features(("Motioncor2", "gCTF"), {"gCTF": 2}, {"gCTF": 1, "Motioncor2": 1})
    {'running_pods_Motioncor2': 1.0, 'running_pods_gCTF': 2.0}
    """
    return {RUNNING_PREFIX + a: float(max(running.get(a, 0), placed.get(a, 0))) for a in apps}


@functools.lru_cache(maxsize=1024)
def _running_columns(feature_names: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    return tuple((j, n) for j, n in enumerate(feature_names) if n.startswith(RUNNING_PREFIX))


def decide(
    snapshot: Snapshot | None, pod: PodInfo, nodes: Sequence[str], assumed: AssumedPods,
    params: DecideParams, now: float,
) -> Decision:
    """Predict, filter and score ``nodes`` for ``pod``; see the module docstring for the rule."""
    app = pod.app
    if app is None:
        return neutral(pod, nodes, NO_APP)
    if snapshot is None:
        return neutral(pod, nodes, NOT_READY)
    if snapshot.age(now) > params.stale_after_s:
        return neutral(pod, nodes, STALE_SNAPSHOT)
    n = len(nodes)
    policy = params.policy
    tab = table_of(snapshot, app)
    pos = tab.positions(nodes)
    known = pos >= 0
    p = np.where(known, pos, 0)
    weight = tab.weight[p]
    cred = np.where(known & ~np.isnan(weight), weight, params.credibility_prior)
    features_ts = tab.features_ts[p]
    fresh = known & ~tab.weights_stale[p] & (features_ts > 0) & (features_ts >= now - params.stale_after_s)
    if not fresh.any():
        return neutral(pod, nodes, STALE_NODES)
    apps = known_apps(snapshot, assumed, app)
    running = np.zeros((n, len(apps)))  # running_pods_<app> per candidate, columns in ``apps`` order
    for j, a in enumerate(apps):
        if a in tab.running_apps:
            running[:, j] = tab.running_of(a)[p]
    at = {name: i for i, name in enumerate(nodes)} if len(assumed) else {}
    pending_on: dict[int, tuple[str, ...]] = {}
    col = {a: j for j, a in enumerate(apps)}
    for name in assumed.nodes():
        i = at.get(name)
        if i is None or not fresh[i]:
            continue
        since = tab.running_ts[p[i]] - policy.scrape_delay_s if tab.running_ts[p[i]] > 0 else -math.inf
        counts, pending = assumed.scan(name, now, float(features_ts[i]), pod.task_id, since)
        for a, c in counts.items():
            ja = col.get(a)
            if ja is not None and c > running[i, ja]:
                running[i, ja] = c
        if pending:
            pending_on[i] = pending
    running[~fresh] = 0.0
    rtt = np.full(n, np.nan)
    keys: list[str | None] = [None] * n
    versions: list[int | None] = [None] * n
    entry_of = np.where(fresh, tab.entry_of[p], -1)
    task = pod.task_features()
    for k in np.unique(entry_of[entry_of >= 0]).tolist():
        idx = np.flatnonzero(entry_of == k)
        entry = tab.entries[k]
        X = entry.matrix[tab.row_of[p[idx]]]
        for task_feature, c in entry.task_columns.items():
            X[:, c] = task.get(task_feature, math.nan)
        for j, feature in _running_columns(entry.feature_names):
            source = col.get(feature[len(RUNNING_PREFIX):])
            X[:, j] = running[idx, source] if source is not None else math.nan
        rtt[idx] = np.asarray(entry.predictor.predict(X), dtype=np.float64)
        for i in idx.tolist():
            keys[i], versions[i] = entry.key, entry.version
    own = fresh & (entry_of < 0)
    rtt[own] = tab.predicted[p[own]]
    corr = np.where(fresh, tab.correction[p], 1.0)
    rtt *= corr
    model_rtt = rtt.copy()
    for i, apps_pending in pending_on.items():
        rtt[i] *= contention_factor(app, apps_pending, policy)
    failed: list[str | None] = [None] * n
    if policy.anti_affinity:
        states = snapshot.nodes
        for i, name in enumerate(nodes):
            st = states.get(name)
            placed = assumed.on_node(name, now, exclude=pod.task_id)
            failed[i] = anti_affinity_reason(app, st.running if st else {}, (pp.app for pp in placed), policy)
    relaxed = False
    if policy.sla(app) is not None:
        sla = [sla_reason(app, float(rtt[i]), policy) if failed[i] is None and fresh[i] else None for i in range(n)]
        remaining = [i for i in range(n) if failed[i] is None]
        if remaining and all(sla[i] is not None for i in remaining) and policy.sla_when_all_fail == "pass":
            relaxed = True
        else:
            failed = [f if f is not None else s for f, s in zip(failed, sla, strict=True)]
    usable = fresh & np.isfinite(rtt) & (rtt > 0)
    rtt = np.where(usable, rtt, np.nan)
    scores = score_nodes(rtt, cred)
    passing = np.array([f is None for f in failed]) if policy.anti_affinity or policy.sla(app) is not None \
        else np.ones(n, dtype=bool)
    samples = tab.samples[p]
    unlearnt = not_learnt(fresh & passing, entry_of >= 0, samples, running[:, col[app]], policy.explore_min_samples)
    e = explored(pod.task_id, nodes, unlearnt, samples, share=policy.explore_share)
    expected = rtt
    if e is not None and not usable[e] and usable.any():  # unknown there: as long as the slowest prediction
        expected = rtt.copy()
        expected[e] = np.nanmax(rtt)
    rtt_list = rtt.tolist()
    assumed.expect(pod.task_id, nodes, expected.tolist())  # how long a placement runs (AssumedPods.assume)
    winner = e
    if winner is None:
        ok = np.flatnonzero(passing & usable)
        if ok.size:
            top = ok[scores[ok] == scores[ok].max()]
            winner = int(top[np.argmin(rtt[top])])
    if winner is not None and n > 1:
        rest = int(np.delete(scores, winner).max())
        if scores[winner] <= rest:  # tied (or explored below others): make the winner the only top
            if rest < MAX_SCORE:
                scores[winner] = rest + 1
            else:
                scores = np.minimum(scores, MAX_SCORE - 1)
                scores[winner] = MAX_SCORE
    return Decision(
        pod, tuple(nodes), scores.tolist(), rtt_list, keys, versions, cred.tolist(), failed,
        fresh.tolist(), np.where(usable, model_rtt, np.nan).tolist(), sla_relaxed=relaxed,
        correction=corr.tolist(), explored=nodes[e] if e is not None else None, running=running, running_apps=apps,
    )
