"""What runs where: which of our pods count on which node, and the per-node counts the extender reads.

A pod counts for its node (``spec.nodeName``) and app (label ``rttsched.io/app``) while it is
``Running`` and not terminating (no ``metadata.deletionTimestamp``). Pending, finished and unlabelled
pods do not count; a pod whose JSON types are not a v1.Pod's raises :class:`~app.scheduler.podinfo.PodError`
and is skipped by :func:`count_running`.

>>> pod = {"metadata": {"uid": "u1", "labels": {"rttsched.io/app": "gCTF"}},
...        "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running"}}
>>> placement(pod)
('u1', ('gpu-1', 'gCTF'))
>>> count_running([pod, {**pod, "metadata": {"uid": "u2", "labels": {"rttsched.io/app": "gCTF"}}}, "junk"])
({'gpu-1': {'gCTF': 2}}, 1)
>>> diff_views({"gpu-1": {"gCTF": 2}, "cpu-1": {"upload": 1}}, {"gpu-1": {"gCTF": 1}, "gpu-2": {"gCTF": 1}})
({'gpu-1': {'gCTF': 1}, 'gpu-2': {'gCTF': 1}}, ['cpu-1'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.scheduler.podinfo import PodError, pod_info

Placement = tuple[str, str]  # (node, app)
View = dict[str, dict[str, int]]  # node -> app -> running pods
RUNNING = "Running"


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
    """``(key, (node, app))`` of a pod that counts, ``(key, None)`` of one that does not.

    ``key`` identifies the pod across watch events: its UID, else ``namespace/name``.
    Raises :class:`PodError` for an object that is not shaped like a v1.Pod or has no identity.
    """
    info = pod_info(pod)  # checks pod and metadata types, reads the app label
    if not info.uid and not info.name:
        raise PodError("Pod has neither metadata.uid nor metadata.name")
    key = info.task_id
    spec = _section(pod, "spec")
    status = _section(pod, "status")
    node = _optional_str(spec, "spec", "nodeName")
    phase = _optional_str(status, "status", "phase")
    terminating = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
    if info.app is None or not node or phase != RUNNING or terminating:
        return key, None
    return key, (node, info.app)


def tally(placements: Iterable[Placement]) -> View:
    """Pods per node per app.

    >>> tally([("n1", "a"), ("n1", "a"), ("n2", "b"), ("n1", "b")])
    {'n1': {'a': 2, 'b': 1}, 'n2': {'b': 1}}
    """
    view: View = {}
    for node, app in placements:
        apps = view.setdefault(node, {})
        apps[app] = apps.get(app, 0) + 1
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


def diff_views(old: Mapping[str, Mapping[str, int]], new: Mapping[str, Mapping[str, int]]) -> tuple[View, list[str]]:
    """What turns ``old`` into ``new``: the nodes to (re)write with their counts, the nodes to delete (sorted)."""
    changed = {node: dict(apps) for node, apps in new.items() if old.get(node) != apps}
    removed = sorted(node for node in old if node not in new)
    return changed, removed
