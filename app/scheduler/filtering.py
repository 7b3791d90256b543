"""Per-node rules of the filter verb and the contention penalty: pure functions of one node's state.

* anti-affinity: a node fails when an app it runs (running-apps view) or was just given (assumed pods)
  interferes with the pod's app (:meth:`Policy.interferes`, symmetric, ``[A, A]`` = two A per node);
* SLA: a node fails when the pod's predicted RTT there (after the contention penalty) exceeds the app's SLA;
* contention: the predicted RTT of a node is multiplied by ``1 + Σ bump``, where each pending assumed pod adds
  ``contention_interfering`` (interfering app) or ``contention_other`` (any other app). Additive, not
  compounding: a burst of placements between two scrapes grows the penalty linearly, never exponentially.

Reasons are short sentences: kube-scheduler shows them in the pod's events.

>>> from app.scheduler.policy import policy_from_dict
>>> p = policy_from_dict({"anti_affinity": [["Motioncor2", "Motioncor2"]], "sla_ms": {"gCTF": 500},
...                       "contention": {"interfering": 0.5, "other": 0.1}})
>>> anti_affinity_reason("Motioncor2", {"Motioncor2": 1}, (), p)
'anti-affinity: Motioncor2 interferes with Motioncor2 already running on this node'
>>> sla_reason("gCTF", 620.0, p)
'predicted RTT 620 ms exceeds the SLA of gCTF (500 ms)'
>>> contention_factor("Motioncor2", ["Motioncor2", "upload"], p)
1.6
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from app.scheduler.policy import Policy


def anti_affinity_reason(
    app: str, running: Mapping[str, int], assumed_apps: Iterable[str], policy: Policy,
) -> str | None:
    """Why ``app`` cannot join a node running ``running`` (app -> count) plus ``assumed_apps``; None if it can."""
    if not policy.anti_affinity:
        return None
    for other, count in running.items():
        if count > 0 and policy.interferes(app, other):
            return f"anti-affinity: {app} interferes with {other} already running on this node"
    for other in assumed_apps:
        if policy.interferes(app, other):
            return f"anti-affinity: {app} interferes with {other} just placed on this node"
    return None


def sla_reason(app: str, predicted_rtt_ms: float, policy: Policy) -> str | None:
    """Why a node with this predicted RTT misses the app's SLA; None when it meets it or has no prediction."""
    sla = policy.sla(app)
    if sla is None or not math.isfinite(predicted_rtt_ms):
        return None
    if predicted_rtt_ms > sla:
        return f"predicted RTT {predicted_rtt_ms:.0f} ms exceeds the SLA of {app} ({sla:.0f} ms)"
    return None


def contention_factor(app: str, pending_apps: Iterable[str], policy: Policy) -> float:
    """Multiplier (>= 1) on a node's predicted RTT for the assumed pods its metrics cannot show yet."""
    factor = 1.0
    for other in pending_apps:
        factor += policy.contention_interfering if policy.interferes(app, other) else policy.contention_other
    return round(factor, 12)
