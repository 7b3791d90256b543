"""What runs where: which of our pods count on which node, and the per-node counts written to Redis.

A labelled pod (``rttsched.io/app``) with a node (``spec.nodeName``) **counts** for that node and app until
it reaches a terminal phase (``Succeeded``/``Failed``) or is deleted — as kube-scheduler keeps every pod that
is not terminal on its node. So a pod bound but still ``Pending`` (pulling images, ContainerCreating), a
``Running`` one, one in ``Unknown`` (its node stopped reporting; it may still run) and a terminating one
(``metadata.deletionTimestamp`` set: its containers run until the grace period ends) all count: the
extender's own record of a placement stops counting about one refresh after it, trusting the view to show
the pod by then. A pod **has started** while it is ``Running`` and not terminating: the narrower count the
bridge's GPU hang check needs (a pod pulling its image or shutting down does no GPU work). Unbound,
finished and unlabelled pods count nowhere; a pod whose JSON types are not a v1.Pod's raises
:class:`~app.scheduler.podinfo.PodError` and is skipped by :func:`count_running`.

A node's value holds both counts, ``{"apps": {app: pods that count}, "started": {app: pods started}}``;
a node has a value while one of our pods counts there.

>>> pod = {"metadata": {"uid": "u1", "labels": {"rttsched.io/app": "gCTF"}},
...        "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running"}}
>>> placement(pod)
('u1', ('gpu-1', 'gCTF', True))
>>> pulling = {"metadata": {"uid": "u2", "labels": {"rttsched.io/app": "gCTF"}},
...            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Pending"}}
>>> count_running([pod, pulling, "junk"])
({'gpu-1': {'apps': {'gCTF': 2}, 'started': {'gCTF': 1}}}, 1)
>>> diff_views({"gpu-1": {"apps": {"gCTF": 2}, "started": {}}}, {"gpu-1": {"apps": {"gCTF": 1}, "started": {}}})
({'gpu-1': {'apps': {'gCTF': 1}, 'started': {}}}, [])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from app.scheduler.podinfo import PodError, pod_info

Placement = tuple[str, str, bool]  # (node, app, started)
Counts = dict[str, int]  # app -> pods
NodeCounts = dict[str, Counts]  # "apps" (pods that count) / "started" (pods started) -> counts
View = dict[str, NodeCounts]  # node -> its counts
RUNNING = "Running"
TERMINAL = frozenset({"Succeeded", "Failed"})


def _section(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = pod.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodError(f"Pod.{name} must be an object (got {type(value).__name__})")
    return value


def _optional_str(section: Mapping[str, Any], path: str, field: str) -> str:
    value = section.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PodError(f"Pod.{path}.{field} must be a string (got {type(value).__name__})")
    return value


def placement(pod: Any) -> tuple[str, Placement | None]:
    """``(key, (node, app, started))`` of a pod that counts, ``(key, None)`` of one that does not.

    ``key`` identifies the pod across watch events: its UID, else ``namespace/name``.
    Raises :class:`PodError` for an object that is not shaped like a v1.Pod or has no identity.
    """
    info = pod_info(pod)  # checks pod and metadata types, reads the app label
    if not info.uid and not info.name:
        raise PodError("Pod has neither metadata.uid nor metadata.name")
    key = info.task_id
    node = _optional_str(_section(pod, "spec"), "spec", "nodeName")
    phase = _optional_str(_section(pod, "status"), "status", "phase")
    if info.app is None or not node or phase in TERMINAL:
        return key, None
    terminating = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
    return key, (node, info.app, phase == RUNNING and not terminating)


def tally(placements: Iterable[Placement]) -> View:
    """Pods per node per app: all that count (``apps``) and those started (``started``).

    >>> tally([("n1", "a", True), ("n1", "a", False), ("n2", "b", True)])
    {'n1': {'apps': {'a': 2}, 'started': {'a': 1}}, 'n2': {'apps': {'b': 1}, 'started': {'b': 1}}}
    """
    view: View = {}
    for node, app, started in placements:
        counts = view.setdefault(node, {"apps": {}, "started": {}})
        counts["apps"][app] = counts["apps"].get(app, 0) + 1
        if started:
            counts["started"][app] = counts["started"].get(app, 0) + 1
    return view


def count_running(pods: Iterable[Any]) -> tuple[View, int]:
    """The running-apps view of a pod list and the number of malformed pods skipped.

    A pod listed twice (same UID) counts once, as the API never lists one pod twice.
    """
    counted: dict[str, Placement] = {}
    malformed = 0
    for pod in pods:
        try:
            key, where = placement(pod)
        except PodError:
            malformed += 1
            continue
        if where is not None:
            counted[key] = where
    return tally(counted.values()), malformed


def diff_views(old: Mapping[str, NodeCounts], new: Mapping[str, NodeCounts]) -> tuple[View, list[str]]:
    """What turns ``old`` into ``new``: the nodes to (re)write with their counts, the nodes to delete (sorted)."""
    changed = {node: {k: dict(v) for k, v in counts.items()} for node, counts in new.items() if old.get(node) != counts}
    removed = sorted(node for node in old if node not in new)
    return changed, removed


def encode_node(counts: NodeCounts, ts: float) -> bytes:
    """A node's Redis value: ``apps`` as :func:`app.scheduler.cache.decode_running` reads it, ``started``, ``ts``.

    >>> encode_node({"apps": {"gCTF": 2}, "started": {"gCTF": 1}}, 5.0)
    b'{"apps":{"gCTF":2},"started":{"gCTF":1},"ts":5.0}'
    """
    return orjson.dumps({"apps": {str(a): int(n) for a, n in counts["apps"].items()},
                         "started": {str(a): int(n) for a, n in counts.get("started", {}).items()},
                         "ts": float(ts)})
