"""Filter and prioritize one pod over a snapshot: pure, batched, never raises on missing data.

Per request (one pod, N candidate nodes):

1. A pod without the app label, no snapshot yet, a snapshot whose newest features are older than
   ``stale_after_s``, or candidates none of which has fresh data: a *neutral* answer — every node passes
   with score 5 (:data:`NEUTRAL_REASONS`).
2. Otherwise each fresh candidate gets a predicted RTT: one ``predict`` call per model for all candidates
   that use it (the node's own model, else app × node class), or node-weights' own prediction when no
   model covers the node. Stale or unknown nodes get no prediction: they pass and score neutral.
3. The prediction is inflated for assumed pods the node's metrics cannot show yet (contention penalty).
4. Filter: anti-affinity, then SLA. When SLA alone would reject every remaining candidate and the policy
   says ``sla_when_all_fail: pass``, nobody fails on SLA (``sla_relaxed``).
5. Scores: :func:`app.scheduler.scoring.score_nodes` with each node's credibility.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from app.scheduler.assumed import AssumedPods
from app.scheduler.filtering import anti_affinity_reason, contention_factor, sla_reason
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import Policy
from app.scheduler.scoring import NEUTRAL_SCORE, score_nodes
from app.scheduler.snapshot import ModelEntry, Snapshot

NO_APP = "no_app_label"
NOT_READY = "not_ready"
STALE_SNAPSHOT = "stale_snapshot"
STALE_NODES = "stale_nodes"
NEUTRAL_REASONS = (NO_APP, NOT_READY, STALE_SNAPSHOT, STALE_NODES)
STALE_REASONS = frozenset((NOT_READY, STALE_SNAPSHOT, STALE_NODES))


@dataclasses.dataclass(frozen=True)
class DecideParams:
    policy: Policy = dataclasses.field(default_factory=Policy)
    credibility_prior: float = 0.5
    stale_after_s: float = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One candidate's outcome. ``predicted_rtt_ms`` includes the contention penalty (NaN: none)."""

    node: str
    score: int = NEUTRAL_SCORE
    predicted_rtt_ms: float = math.nan
    model_key: str | None = None
    model_version: int | None = None
    credibility: float = math.nan
    failed: str | None = None
    stale: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    pod: PodInfo
    verdicts: tuple[NodeVerdict, ...]
    neutral: str | None = None  # one of NEUTRAL_REASONS, None for a scored answer
    sla_relaxed: bool = False

    @property
    def stale(self) -> bool:
        return self.neutral in STALE_REASONS

    def failed_nodes(self) -> dict[str, str]:
        return {v.node: v.failed for v in self.verdicts if v.failed is not None}

    def passed(self) -> list[str]:
        return [v.node for v in self.verdicts if v.failed is None]

    def scores(self) -> list[tuple[str, int]]:
        return [(v.node, v.score) for v in self.verdicts]

    def predicted(self) -> list[NodeVerdict]:
        """Candidates with a usable prediction (what gets published)."""
        return [v for v in self.verdicts if math.isfinite(v.predicted_rtt_ms)]

    def best(self) -> str | None:
        """The top-scored passing node with a prediction (lowest RTT breaks ties); None when neutral."""
        ok = [v for v in self.verdicts if v.failed is None and math.isfinite(v.predicted_rtt_ms)]
        if self.neutral is not None or not ok:
            return None
        return min(ok, key=lambda v: (-v.score, v.predicted_rtt_ms)).node


def neutral(pod: PodInfo, nodes: Sequence[str], reason: str) -> Decision:
    """Everyone passes with the neutral score."""
    return Decision(pod, tuple(NodeVerdict(n) for n in nodes), neutral=reason)


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
    rtt = np.full(n, np.nan)
    cred = np.full(n, params.credibility_prior)
    fresh = np.zeros(n, dtype=bool)
    keys: list[str | None] = [None] * n
    versions: list[int | None] = [None] * n
    groups: dict[str, tuple[ModelEntry, list[int], list[str]]] = {}
    states = snapshot.nodes
    for i, name in enumerate(nodes):
        st = states.get(name)
        if st is None:
            continue
        if st.weight is not None:
            cred[i] = st.weight
        if st.is_stale(now, params.stale_after_s):
            continue
        fresh[i] = True
        entry = snapshot.model_for(app, st)
        if entry is not None:
            g = groups.get(entry.key)
            if g is None:
                g = groups[entry.key] = (entry, [], [])
            g[1].append(i)
            g[2].append(name)
        else:
            rtt[i] = st.predicted_rtt_ms.get(app, math.nan)
    if not fresh.any():
        return neutral(pod, nodes, STALE_NODES)
    task = pod.task_features()
    for entry, idx, names in groups.values():
        rtt[idx] = np.asarray(entry.predictor.predict(entry.rows(names, task)), dtype=np.float64)
        for i in idx:
            keys[i], versions[i] = entry.key, entry.version
    policy = params.policy
    failed: list[str | None] = [None] * n
    for i, name in enumerate(nodes):
        placed = assumed.on_node(name, now, exclude=pod.task_id)
        st = states.get(name)
        if placed and fresh[i]:
            pending = assumed.pending(name, st.features_ts if st else 0.0, now, exclude=pod.task_id)
            rtt[i] *= contention_factor(app, (p.app for p in pending), policy)
        failed[i] = anti_affinity_reason(app, st.running if st else {}, (p.app for p in placed), policy)
    sla = [sla_reason(app, float(rtt[i]), policy) if failed[i] is None and fresh[i] else None for i in range(n)]
    remaining = [i for i in range(n) if failed[i] is None]
    relaxed = False
    if remaining and all(sla[i] is not None for i in remaining) and policy.sla_when_all_fail == "pass":
        relaxed = True
    elif any(sla):
        failed = [f if f is not None else s for f, s in zip(failed, sla, strict=True)]
    rtt = np.where(fresh & np.isfinite(rtt) & (rtt > 0), rtt, np.nan)
    scores = score_nodes(rtt, cred)
    verdicts = tuple(
        NodeVerdict(node=name, score=int(scores[i]), predicted_rtt_ms=float(rtt[i]), model_key=keys[i],
                    model_version=versions[i], credibility=float(cred[i]), failed=failed[i], stale=not fresh[i])
        for i, name in enumerate(nodes)
    )
    return Decision(pod, verdicts, sla_relaxed=relaxed)
