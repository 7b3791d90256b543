"""Which app a pod is, and what the task brings with it, read from the pod kube-scheduler sends.

A pod opts in with the label ``rttsched.io/app`` (e.g. ``rttsched.io/app: gCTF``); the optional
annotation ``rttsched.io/input-size-mb`` gives the task's input size, a model feature
(``task_input_size_mb``). A pod without the label is not ours: it gets neutral scores and no filtering.

>>> p = pod_info({"metadata": {"name": "ctf-1", "namespace": "em", "uid": "u-1",
...               "labels": {"rttsched.io/app": "gCTF"},
...               "annotations": {"rttsched.io/input-size-mb": "512"}}})
>>> (p.app, p.input_size_mb, p.task_id)
('gCTF', 512.0, 'u-1')
>>> pod_info({"metadata": {"name": "web", "namespace": "default"}}).app is None
True
>>> pod_info({"metadata": {"name": "web", "namespace": "default"}}).task_id
'default/web'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from app.contracts.keys import APP_PATTERN
from app.errors import RttError

APP_LABEL = "rttsched.io/app"
INPUT_SIZE_ANNOTATION = "rttsched.io/input-size-mb"
MAX_APP_LEN = 64  # rtt-predictions contract: app maxLength
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max (no numpy here): feature rows are float32


class PodError(RttError, ValueError):
    """The pod object is not shaped like a v1.Pod (wrong JSON types where the API has fixed ones)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PodInfo:
    """What scheduling needs to know about one pod.

    ``app`` is None for a pod without the app label. ``input_size_mb`` is NaN when not annotated (or not a
    usable number), which a model treats as missing.
    """

    name: str
    namespace: str
    uid: str
    app: str | None
    input_size_mb: float

    @property
    def task_id(self) -> str:
        """The id predictions are published under: the pod UID, else ``namespace/name``."""
        return self.uid or f"{self.namespace}/{self.name}"

    def task_features(self) -> dict[str, float]:
        """Task attributes as model features (:data:`app.features.vector.TASK_FEATURES`)."""
        return {"task_input_size_mb": self.input_size_mb}


def _string_map(meta: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = meta.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodError(f"Pod.metadata.{field} must be an object (got {type(value).__name__})")
    return value


def _str(meta: Mapping[str, Any], field: str) -> str:
    value = meta.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PodError(f"Pod.metadata.{field} must be a string (got {type(value).__name__})")
    return value


def _size(raw: Any) -> float:
    if not isinstance(raw, str):
        return math.nan
    try:
        size = float(raw.strip())
    except ValueError:
        return math.nan
    # the models' feature rows are float32: a size beyond its range would be scored as inf, so it is no size
    return size if 0 <= size <= FLOAT32_MAX else math.nan


def pod_info(pod: Any) -> PodInfo:
    """Read a v1.Pod JSON object; :class:`PodError` when its metadata has the wrong JSON types.

    Label values that are not usable app names (empty, too long, not a string, not a Kubernetes label value:
    the contracts' ``app``) count as no label.
    """
    if not isinstance(pod, dict):
        raise PodError(f"Pod must be an object (got {type(pod).__name__})")
    meta = pod.get("metadata")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise PodError(f"Pod.metadata must be an object (got {type(meta).__name__})")
    return pod_from_metadata(_str(meta, "name"), _str(meta, "namespace"), _str(meta, "uid"),
                             _string_map(meta, "labels"), _string_map(meta, "annotations"))


def pod_from_metadata(
    name: str, namespace: str, uid: str, labels: Mapping[str, Any], annotations: Mapping[str, Any],
) -> PodInfo:
    """A :class:`PodInfo` from already type-checked metadata fields (what a typed decoder hands over).

    >>> pod_from_metadata("p", "ns", "", {APP_LABEL: "x" * 65}, {INPUT_SIZE_ANNOTATION: "-1"})
    PodInfo(name='p', namespace='ns', uid='', app=None, input_size_mb=nan)
    >>> pod_from_metadata("p", "ns", "", {APP_LABEL: "POST /upload"}, {}).app is None  # no label value
    True
    """
    app = labels.get(APP_LABEL)
    if not isinstance(app, str) or not app or len(app) > MAX_APP_LEN or not APP_PATTERN.fullmatch(app):
        app = None
    return PodInfo(name=name, namespace=namespace, uid=uid, app=app,
                   input_size_mb=_size(annotations.get(INPUT_SIZE_ANNOTATION)))
