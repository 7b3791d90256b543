"""Ask the real scheduler extender over HTTP where each task goes, as kube-scheduler would.

For every task the policy POSTs an ``ExtenderArgs`` to ``{url}/filter`` and then, when more than one node
passed, to ``{url}/prioritize`` over the nodes that passed, as kube-scheduler does (``schedulePod``: one
feasible node is bound without prioritize, none leaves the pod pending: the policy returns None and the
cluster tries it again at the next completion). The args hold a realistic v1 Pod (label
``rttsched.io/app``, annotation ``rttsched.io/input-size-mb``, ``metadata.uid`` = the task's id, so the
extender's rtt-predictions join the simulator's task-completions on ``task_id``) and the candidates, as
``NodeNames`` (``nodeCacheCapable: true``) or as a full ``NodeList`` (``false``). It takes the top score.

Tie-break: among the candidates sharing the top score - all of them when the extender answers neutral
(every score 5: no model or no fresh data yet) - the choice is Kubernetes' default scoring
(:class:`~app.sim.policies.kube_default.KubeDefault`), which is what kube-scheduler's own plugins would
decide. When the extender cannot be reached or answers garbage, the policy falls back to that default over
all candidates and counts the error (kube-scheduler ignores a failed call of an ``ignorable`` extender the
same way).

>>> pod = pod_json("t0000007", "gCTF", 512.0)
>>> pod["metadata"]["uid"], pod["metadata"]["labels"]["rttsched.io/app"]
('t0000007', 'gCTF')
>>> top_hosts([{"Host": "a", "Score": 7}, {"Host": "b", "Score": 9}, {"Host": "c", "Score": 9}], {"a", "b", "c"})
['b', 'c']
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import orjson

from app.scheduler.cycle import top_scored
from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.kube_default import KubeDefault
from app.sim.view import ClusterView, Task

APP_LABEL = "rttsched.io/app"
INPUT_SIZE_ANNOTATION = "rttsched.io/input-size-mb"
NEUTRAL_SCORE = 5


def pod_json(task_id: str, app: str, input_mb: float, *, namespace: str = "cryoem", cpu: float = 1.0,
             mem_gb: float = 2.0, gpus: int = 0) -> dict[str, Any]:
    """A v1 Pod as kube-scheduler sends it to an extender (only the fields that matter, realistically shaped)."""
    requests: dict[str, str] = {"cpu": f"{int(cpu * 1000)}m", "memory": f"{int(mem_gb * 1024)}Mi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{app.lower()}-{task_id}", "namespace": namespace, "uid": task_id,
            "labels": {APP_LABEL: app, "app.kubernetes.io/part-of": "cryoem-pipeline"},
            "annotations": {INPUT_SIZE_ANNOTATION: f"{input_mb:.3f}"},
        },
        "spec": {
            "schedulerName": "rttsched-scheduler", "restartPolicy": "Never",
            "containers": [{"name": app.lower(), "image": f"registry.local/cryoem/{app.lower()}:1.0",
                            "resources": {"requests": requests, "limits": dict(requests)}}],
        },
        "status": {"phase": "Pending"},
    }


def node_json(node: NodeSpec) -> dict[str, Any]:
    """A v1 Node for ``nodeCacheCapable: false`` requests."""
    labels = {"kubernetes.io/hostname": node.name, "rttsched.io/node-class": node.node_class}
    allocatable = {"cpu": str(node.cpu_cores), "memory": f"{int(node.mem_gb * 1024)}Mi"}
    if node.gpu_model:
        labels["nvidia.com/gpu.product"] = node.gpu_model.replace(" ", "-")
        allocatable["nvidia.com/gpu"] = str(node.gpu_shares)
    return {"metadata": {"name": node.name, "labels": labels}, "status": {"allocatable": allocatable}}


def top_hosts(answer: Any, candidates: Collection[str]) -> list[str]:
    """The candidates sharing the highest score of a HostPriorityList (empty if none is usable)."""
    if not isinstance(answer, list):
        return []
    scores: dict[str, int] = {}
    for item in answer:
        if isinstance(item, dict) and item.get("Host") in candidates and isinstance(item.get("Score"), int):
            scores[item["Host"]] = item["Score"]
    return top_scored(scores.items())


class ExtenderPolicy(BasePolicy):
    """Placement by the extender's ``prioritize`` answer; see the module docstring for the tie-break.

    Parameters
    ----------
    url : str
        The extender's ``urlPrefix``, e.g. ``http://127.0.0.1:8888``.
    rng : numpy.random.Generator
        Random tie-break of the kube-default fallback.
    node_cache_capable : bool
        Send ``NodeNames`` (True) or a full ``NodeList`` (False).
    timeout_s : float
        HTTP timeout of one call (kube-scheduler's ``httpTimeout``).
    """

    name = "extender"

    def __init__(self, url: str, rng: np.random.Generator, *, node_cache_capable: bool = True,
                 timeout_s: float = 2.0, namespace: str = "cryoem") -> None:
        super().__init__()
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"url: must be http://host:port[/prefix] (got {url!r})")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0 (got {timeout_s})")
        self.url = url
        self._host, self._port = parsed.hostname, parsed.port or 80
        self._prefix = parsed.path.rstrip("/")
        self.node_cache_capable = node_cache_capable
        self.timeout_s = timeout_s
        self.namespace = namespace
        self._fallback = KubeDefault(rng)
        self._conn: http.client.HTTPConnection | None = None
        self.recent_rtt_ms: deque[float] = deque(maxlen=200)
        self.stats = {"requests": 0, "scored": 0, "neutral": 0, "errors": 0, "bound": 0, "filtered_out": 0,
                      "http_s": 0.0}
        self.trace.notes["extender"] = self.stats

    def _post(self, verb: str, body: bytes) -> Any:
        for attempt in (0, 1):  # one retry on a connection the server closed while idle
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            try:
                self._conn.request("POST", f"{self._prefix}/{verb}", body, {"Content-Type": "application/json"})
                resp = self._conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise http.client.HTTPException(f"{verb} answered {resp.status}: {data[:200]!r}")
            return orjson.loads(data)
        raise AssertionError("unreachable")

    def prioritize(self, task: Task, candidates: Sequence[NodeSpec]) -> Any:
        """The extender's raw HostPriorityList for ``task`` over ``candidates``."""
        return self._post("prioritize", self._args(task, candidates))

    def filter(self, task: Task, candidates: Sequence[NodeSpec]) -> list[str]:
        """The names of ``candidates`` that pass the extender's filter for ``task``, in their order."""
        answer = self._post("filter", self._args(task, candidates))
        if not isinstance(answer, dict) or answer.get("Error"):
            raise http.client.HTTPException(f"filter answered an error: {str(answer)[:200]}")
        if self.node_cache_capable:
            names = answer.get("NodeNames")
        else:
            nodes = answer.get("Nodes")
            names = [it.get("metadata", {}).get("name") for it in (nodes or {}).get("items") or ()]
        if not isinstance(names, list):
            raise http.client.HTTPException(f"filter answered no node list: {str(answer)[:200]}")
        asked = {c.name for c in candidates}
        return [n for n in names if n in asked]

    def _args(self, task: Task, candidates: Sequence[NodeSpec]) -> bytes:
        place = task.profile.place
        pod = pod_json(task.task_id, task.app, task.input_mb, namespace=self.namespace, cpu=place.cpu_cores,
                       mem_gb=place.mem_gb, gpus=place.gpu_share)
        if self.node_cache_capable:
            args: dict[str, Any] = {"Pod": pod, "Nodes": None, "NodeNames": [n.name for n in candidates]}
        else:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [node_json(n) for n in candidates]},
                    "NodeNames": None}
        return orjson.dumps(args)

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec | None:
        self.stats["requests"] += 1
        t0 = time.perf_counter()
        by_name = {n.name: n for n in candidates}
        answer: Any = None
        try:
            passing = self.filter(task, candidates)
            if len(passing) > 1:
                answer = self.prioritize(task, [by_name[n] for n in passing])
        except (OSError, http.client.HTTPException, orjson.JSONDecodeError):
            self.stats["http_s"] += time.perf_counter() - t0
            self.stats["errors"] += 1
            return self._fallback.choose(task, candidates, view)
        self.stats["http_s"] += time.perf_counter() - t0
        if not passing:  # every node failed the filter: the pod stays pending
            self.stats["filtered_out"] += 1
            return None
        if len(passing) == 1:  # bound without prioritize
            self.stats["bound"] += 1
            return by_name[passing[0]]
        top = top_hosts(answer, set(passing))
        if not top:
            self.stats["errors"] += 1
            return self._fallback.choose(task, candidates, view)
        if isinstance(answer, list) and all(isinstance(a, dict) and a.get("Score") == NEUTRAL_SCORE for a in answer):
            self.stats["neutral"] += 1
        else:
            self.stats["scored"] += 1
        if len(top) == 1:
            return by_name[top[0]]
        return self._fallback.choose(task, [by_name[h] for h in top], view)

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        self.recent_rtt_ms.append(rtt_ms)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
