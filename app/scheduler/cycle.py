"""One pod's scheduling cycle with this extender: what each verb's answer makes kube-scheduler do.

kube-scheduler (``pkg/scheduler/schedule_one.go``, ``schedulePod``): its own filter plugins give the feasible
nodes; the extender's filter removes the nodes it fails (``findNodesThatPassExtenders``); when one node is left
it is bound without a prioritize call; when several are left, prioritize scores them (the extender's scores,
weighted, added to the default plugins'), and kube-scheduler binds the top one. No node left: the pod stays
pending and is tried again later.

The extender answers each verb with :func:`~app.scheduler.decide.decide` (:class:`app.extender.service.
ExtenderService`), and assumes the pod where it expects it to go: the single node left after its filter, or
the winner of its prioritize (:func:`assume`). :func:`schedule` runs the same steps in process, in the order
kube-scheduler calls them (the simulator's ``rtt_aware``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from app.scheduler.assumed import AssumedPods
from app.scheduler.decide import DecideParams, Decision, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.snapshot import Snapshot


@dataclasses.dataclass(frozen=True)
class FilterAnswer:
    """What kube-scheduler keeps after the extender's filter (``passing``; a neutral answer passes every node),
    and the index in ``decision.nodes`` of the node it binds without prioritize when the answer is scored, the
    pod has an app and exactly one node passes (``bound``; None otherwise)."""

    decision: Decision
    passing: tuple[str, ...]
    bound: int | None

    @property
    def bound_expected_s(self) -> float | None:
        """How long the bound pod is expected to run: its prediction there (NaN without one: the assumed pods'
        TTL, whatever an earlier prioritize of the pod noted); None when no node is bound."""
        if self.bound is None:
            return None
        return self.decision.rtt_ms[self.bound] / 1000.0


def filter_answer(d: Decision) -> FilterAnswer:
    """The filter verb's outcome of ``d`` (a :func:`decide` of the filter request)."""
    passing = d.nodes if d.neutral is not None or d.failed.count(None) == len(d.nodes) else tuple(d.passed())
    bound = None
    if d.neutral is None and d.pod.app and len(passing) == 1:
        bound = next(i for i, f in enumerate(d.failed) if f is None)
    return FilterAnswer(d, passing, bound)


def assume(assumed: AssumedPods, d: Decision, node: str | None, now: float, expected_s: float | None = None) -> None:
    """Note ``d``'s pod as placed on ``node`` at ``now`` (``expected_s``: its expected run, else the one ``decide``
    noted for the node); ``node`` None: placed nowhere the extender expects, and what ``decide`` noted goes."""
    pod = d.pod
    if node is None or pod.app is None:
        assumed.unexpect(pod.task_id)
        return
    assumed.assume(pod.task_id, pod.app, node, now, expected_s=expected_s, input_mb=pod.input_size_mb)


@dataclasses.dataclass(frozen=True)
class Cycle:
    """One pod's cycle (:func:`schedule`).

    ``feasible``: the nodes left after the extender's filter; ``decision``: the answer that placed the pod (the
    filter's when one node was left, else prioritize's; None when no node was left); ``node``: where the
    extender assumed the pod (None: it did not: a neutral answer, no prediction anywhere, or no node left —
    kube-scheduler then places it by its own scores among ``top``, or leaves it pending when ``feasible`` is
    empty); ``top``: the feasible nodes sharing the highest extender score (every feasible node when one or
    none was scored).
    """

    feasible: tuple[str, ...]
    decision: Decision | None
    node: str | None
    top: tuple[str, ...]


def schedule(snapshot: Snapshot | None, pod: PodInfo, nodes: Sequence[str], assumed: AssumedPods,
             params: DecideParams, now: float) -> Cycle:
    """The extender's part of one cycle over ``nodes`` (the nodes kube-scheduler's own filters passed): its
    filter, then its prioritize over the nodes the filter left when more than one is left, with the extender's
    side effects (the candidates' expected runs noted by prioritize, the pod assumed where it is expected to go).

    When the policy has no filter rule (no anti-affinity, no SLA) and there are several nodes, the filter can
    fail none of them: its answer is every node, and it is not computed. When the filter passes every node,
    prioritize over the same nodes in the same state would decide the same: the filter's decision is taken.
    """
    policy = params.policy
    names = tuple(nodes)
    skipped = len(names) > 1 and not policy.anti_affinity and not policy.sla_ms
    d: Decision | None = None
    if skipped:
        feasible = names
    else:  # noting the expected runs as prioritize would (used only if the filter keeps every node)
        f = filter_answer(decide(snapshot, pod, names, assumed, params, now))
        feasible = f.passing
        if len(feasible) <= 1:
            if f.bound is not None:
                assume(assumed, f.decision, feasible[0], now, f.bound_expected_s)
                return Cycle(feasible, f.decision, feasible[0], feasible)
            assume(assumed, f.decision, None, now)
            return Cycle(feasible, f.decision if feasible else None, None, feasible)
        if feasible == names:
            d = f.decision
    if d is None:  # the filter's rows are remembered for prioritize (a skipped filter remembered none)
        d = decide(snapshot, pod, feasible, assumed, params, now, remember_rows=skipped)
    winner = d.best()
    assume(assumed, d, winner, now)
    return Cycle(feasible, d, winner, _top(d.nodes, d.score))


def _top(nodes: tuple[str, ...], score: list[int]) -> tuple[str, ...]:
    """:func:`top_scored` of ``zip(nodes, score)``, without the pairs (a single top node is the usual case)."""
    if not score:
        return ()
    best = max(score)
    if score.count(best) == 1:
        return (nodes[score.index(best)],)
    return tuple(h for h, s in zip(nodes, score, strict=True) if s == best)


def top_scored(scores: Iterable[tuple[str, int]]) -> list[str]:
    """The hosts sharing the highest score of (host, score) pairs, in their order (empty if none): where
    kube-scheduler's own scores decide among the extender's best."""
    pairs = list(scores)
    best = max((s for _, s in pairs), default=None)
    return [h for h, s in pairs if s == best]
