"""Why each candidate node got its score: the decision of :func:`~app.scheduler.decide.decide`, taken apart.

:func:`explain` runs the very decision a ``prioritize`` would make (same snapshot, policy and assumed pods,
nothing noted in them) and says, per candidate, in the order it was applied:

1. the model's prediction (``model_rtt_ms``; which model and version; or node-weights' own prediction when
   no model covers the node), and the features that moved it most: XGBoost ``pred_contribs`` on the rows the
   model saw (:mod:`app.model.contributions`; on the margin scale, with the link and the bias);
2. the residual correction for the app on that node (``correction``, a factor);
3. the penalty for pods assumed on the node that its metrics cannot show yet (``penalty``, a factor, and
   those pods' apps): ``rtt_ms`` = model × correction × penalty, what the score is computed from;
4. the filters: anti-affinity and SLA reasons (a filtered node cannot win);
5. credibility and the score: ``raw_score`` = 10 × best / rtt, pulled toward 5 by credibility
   (``blended_score``), rounded; ``score`` is the final one, after the winner is made the only top;
6. exploration: whether the node is learnt for the app (samples), and whether this pod explores it.

The answer is plain JSON (the extender's ``POST /explain``, ``rttsched explain --json``). The decision is taken
apart by :func:`prepare` (fast: what the scheduling path itself computes); the contributions, which load boosters
from the registry and run XGBoost, by :meth:`Explanation.finish`, which reads nothing the scheduling path changes,
so the extender runs it off its event loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from app.scheduler.assumed import AssumedPods
from app.scheduler.decide import DecideParams, Decision, decide, known_apps, model_rows, running_features
from app.scheduler.podinfo import PodInfo
from app.scheduler.scoring import blended_scores, raw_scores
from app.scheduler.snapshot import Snapshot

BoosterSource = Callable[[str, int], Any]  # (model key, version) -> xgboost.Booster; raises when it cannot


def _num(v: float, digits: int = 3) -> float | None:
    return round(float(v), digits) if v is not None and math.isfinite(v) else None


def _hardware(snapshot: Snapshot | None, node: str) -> str | None:
    st = snapshot.nodes.get(node) if snapshot is not None else None
    if st is None:
        return None
    return st.gpu_model or st.node_class


def _contributions(snapshot: Snapshot, idle: Mapping[str, float], d: Decision, boosters: BoosterSource | None,
                   top: int, method: str, out: list[dict[str, Any]]) -> None:
    """Fill each modelled candidate's ``contributions`` (grouped by model: one pred_contribs call per model).
    ``idle``: the running-pods features of a node with nothing running, as decide built the rows."""
    from app.model.contributions import contributions

    groups: dict[tuple[str, int], list[int]] = {}
    for i, (key, version) in enumerate(zip(d.model_key, d.model_version, strict=True)):
        if key is not None and version is not None:
            groups.setdefault((key, version), []).append(i)
    for (key, version), picked in groups.items():
        entry = snapshot.models.get(key)
        if entry is None or entry.version != version:
            continue
        if boosters is None:
            for i in picked:
                out[i]["contributions_error"] = "no model registry to load the booster from"
            continue
        try:
            booster = boosters(key, version)
        except Exception as exc:  # the registry away or the blob gone: the rest of the answer still stands
            for i in picked:
                out[i]["contributions_error"] = f"booster {key} v{version} not loaded: {exc}"
            continue
        rows = np.array([entry.row_index[d.nodes[i]] for i in picked], dtype=np.int64)
        X = model_rows(entry, rows, d.pod.task_features(), [d.features[i] for i in picked], idle)
        c = contributions(booster, X, entry.feature_names, method=method)
        for k, i in enumerate(picked):
            out[i].update(
                contributions=[{"feature": f, "value": _num(v, 6), "contribution": round(cv, 6)}
                               for f, v, cv in c.top(k, top)],
                bias=round(float(c.bias[k]), 6), margin=round(float(c.margin[k]), 6), link=c.link,
                contributions_sum=round(float(c.values[k].sum() + c.bias[k]), 6))


@dataclasses.dataclass
class Explanation:
    """A decision taken apart (:func:`prepare`); :meth:`finish` adds the contributions and orders the nodes."""

    head: dict[str, Any]
    nodes: list[dict[str, Any]] | None = None  # None: a neutral answer, complete in ``head``
    snapshot: Snapshot | None = None
    decision: Decision | None = None
    idle: Mapping[str, float] = dataclasses.field(default_factory=dict)
    boosters: BoosterSource | None = None
    top: int = 3
    method: str = "approx"

    @property
    def needs_work(self) -> bool:
        """Whether :meth:`finish` has contributions to compute (a model covers some candidate)."""
        return self.decision is not None and any(k is not None for k in self.decision.model_key)

    def finish(self) -> dict[str, Any]:
        """The answer: the contributions filled in (boosters loaded, pred_contribs run), the nodes best first."""
        if self.nodes is None:
            return self.head
        out = self.nodes
        assert self.snapshot is not None and self.decision is not None
        _contributions(self.snapshot, self.idle, self.decision, self.boosters, self.top, self.method, out)
        order = sorted(range(len(out)), key=lambda i: (-out[i]["score"], out[i]["rtt_ms"] or math.inf))
        self.head["nodes"] = [out[i] for i in order]
        return self.head


def explain(
    snapshot: Snapshot | None, pod: PodInfo, nodes: Sequence[str], assumed: AssumedPods, params: DecideParams,
    now: float, boosters: BoosterSource | None = None, *, top: int = 3, method: str = "approx",
) -> dict[str, Any]:
    """The decision for ``pod`` over ``nodes``, per candidate, as JSON-able values (see the module docstring)."""
    return prepare(snapshot, pod, nodes, assumed, params, now, boosters, top=top, method=method).finish()


def prepare(
    snapshot: Snapshot | None, pod: PodInfo, nodes: Sequence[str], assumed: AssumedPods, params: DecideParams,
    now: float, boosters: BoosterSource | None = None, *, top: int = 3, method: str = "approx",
) -> Explanation:
    """The decision for ``pod`` over ``nodes`` taken apart, all but the contributions (:meth:`Explanation.finish`)."""
    d = decide(snapshot, pod, nodes, assumed, params, now, note_expected=False)
    head: dict[str, Any] = {
        "pod": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "app": pod.app,
                "input_size_mb": _num(pod.input_size_mb)},
        "neutral": d.neutral, "best": d.best(), "explored": d.explored, "sla_relaxed": d.sla_relaxed,
        "sla_ms": params.policy.sla(pod.app) if pod.app else None, "contributions_method": method,
    }
    if d.neutral is not None:
        head["nodes"] = [{"node": n, "hardware": _hardware(snapshot, n), "score": s}
                         for n, s in zip(d.nodes, d.score, strict=True)]
        return Explanation(head)
    assert snapshot is not None and pod.app is not None
    raw = raw_scores(np.asarray(d.rtt_ms))
    blended = blended_scores(np.asarray(d.rtt_ms), np.asarray(d.credibility))
    routes = snapshot.app_routes(pod.app)
    out: list[dict[str, Any]] = []
    for i, node in enumerate(d.nodes):
        corrected, rtt, corr = d.model_rtt_ms[i], d.rtt_ms[i], d.correction[i]
        failed = d.failed[i]
        st = snapshot.nodes.get(node)
        pending = [p.app for p in assumed.on_node(node, now, exclude=pod.task_id)] if st is not None else []
        samples = int(st.samples.get(pod.app, 0)) if st is not None else 0
        out.append({
            "node": node, "hardware": _hardware(snapshot, node), "fresh": d.fresh[i], "score": d.score[i],
            "source": "model" if d.model_key[i] else "node-weights" if math.isfinite(corrected) else None,
            "model_key": d.model_key[i], "model_version": d.model_version[i],
            "model_rtt_ms": _num(corrected / corr if corr else math.nan), "correction": _num(corr, 4),
            "penalty": _num(rtt / corrected if math.isfinite(corrected) and corrected > 0 else math.nan, 4),
            "assumed_pods": pending, "rtt_ms": _num(rtt), "credibility": _num(d.credibility[i], 4),
            "raw_score": _num(raw[i]), "blended_score": _num(blended[i]),
            "tie_break": bool(math.isfinite(raw[i]) and d.score[i] != int(np.rint(blended[i]))),
            "failed": failed,
            "anti_affinity": failed if failed and failed.startswith("anti-affinity") else None,
            "sla": failed if failed and not failed.startswith("anti-affinity") else None,
            "explored": d.explored == node, "samples": samples,
            "learnt": bool(routes is not None and d.model_key[i] is not None
                           and samples >= params.policy.explore_min_samples),
            "features": dict(d.features[i]) if d.features else {},
            "contributions": None,
        })
    idle = running_features(known_apps(snapshot, assumed, pod.app), {}, {})  # as decide built the rows
    return Explanation(head, out, snapshot, d, idle, boosters, top, method)
