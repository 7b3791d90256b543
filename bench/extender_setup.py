"""Shared parts of the extender benchmark: the model, the view, the payloads, and the two baselines.

The model is a real XGBoost regressor with the GPU preset (150 trees, depth 8) over 46 features; the view
holds one node-features / node-weights value per node; the payloads are full v1.Pod / v1.NodeList objects
as kube-scheduler sends them (cloned from tests/fixtures/kube/), or the NodeNames form.

Baselines (what a competent operator writes without our predictor and caches): decode the body with
orjson, build each candidate's row from the node's feature dict (:func:`app.features.vector.row`, the
same features, hardware descriptors and task size as ours), predict with ``xgboost.Booster.inplace_predict``
— once for the stacked rows (*batched*) or once per node (*per node*) — score with the same
:func:`app.scheduler.scoring.score_nodes`, encode with orjson. The booster runs on one thread, as ours.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.clock import ManualClock  # noqa: E402
from app.config import Settings  # noqa: E402
from app.extender.options import ExtenderOptions  # noqa: E402
from app.extender.protocol import parse_args  # noqa: E402
from app.extender.service import ExtenderService  # noqa: E402
from app.features.hardware import HARDWARE_FEATURES  # noqa: E402
from app.features.vector import row  # noqa: E402
from app.scheduler.builder import node_features_map  # noqa: E402
from app.scheduler.policy import Policy  # noqa: E402
from app.scheduler.scoring import score_nodes  # noqa: E402

KUBE = ROOT / "tests" / "fixtures" / "kube"
METRICS = ("nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "pcie_rx_bytes",
           "cpu_usage_system", "cpu_iowait", "memory_cache_usage", "gpu_mem_bw_util")
AGGS = ("mean", "min", "max", "last", "std")
NODE_FEATURES = tuple(f"{m}__{a}" for m in METRICS for a in AGGS)
FEATURES = (*NODE_FEATURES, *HARDWARE_FEATURES, "task_input_size_mb")
GPUS = ("NVIDIA GeForce RTX 4090", "Tesla M40", "Tesla K20c")
CREDIBILITY = 0.8
POD_UID = "0b7d3f52-91c4-4a7e-bb0e-2f5e4d6c8a10"  # tests/fixtures/kube/pod_gctf.json


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def train(seed: int = 0) -> Any:
    """A GPU-preset XGBoost model of RTT over FEATURES (synthetic data, fixed seed), one thread."""
    from app.model.train import train_model

    rng = np.random.default_rng(seed)
    n = 3000
    X = rng.uniform(0, 1, (n, len(FEATURES))).astype(np.float32)
    y = 100 + 800 * X[:, 0] + 300 * X[:, 7] * X[:, 12] + 50 * X[:, -1] + rng.normal(0, 10, n)
    booster = train_model(X, y, FEATURES, "gpu", max_samples=n).booster
    booster.set_param({"nthread": 1})
    return booster


def node_names(n: int) -> list[str]:
    return [f"gpu-{i:04d}" for i in range(n)]


def features_value(name: str, i: int, ts: float, rng: np.random.Generator) -> dict[str, Any]:
    return {"node": name, "ts": ts, "node_class": "gpu", "gpu_model": GPUS[i % 3], "window_s": 30.0, "count": 30,
            "features": {f: float(v) for f, v in zip(NODE_FEATURES, rng.uniform(0, 1, len(NODE_FEATURES)),
                                                     strict=True)}}


def weights_value(name: str, ts: float) -> dict[str, Any]:
    return {"node": name, "ts": ts, "weight": CREDIBILITY, "predicted_rtt_ms": {}, "stale": False}


def view(n: int, ts: float, seed: int = 1) -> list[dict[str, Any]]:
    """node-features values of ``n`` nodes (fixed seed)."""
    rng = np.random.default_rng(seed)
    return [features_value(name, i, ts, rng) for i, name in enumerate(node_names(n))]


def in_process_service(booster: Any, features: list[dict[str, Any]], now: float) -> ExtenderService:
    """The service a request meets, without Kafka or Redis: the view and the model installed, no publishing."""
    from app.model.fast import FastPredictor

    settings = Settings.from_env({})
    service = ExtenderService(settings, ExtenderOptions.from_settings(settings), policy=Policy(),
                              clock=ManualClock(now), publish=False, kafka=False, redis=False)
    for value in features:
        service.builder.apply_node_features(value)
        service.builder.apply_node_weights(weights_value(value["node"], value["ts"]))
    service.builder.set_model("gCTF:gpu", 1, FastPredictor.from_booster(booster, FEATURES))
    service.rebuild(force=True)
    return service


def payload(n: int, mode: str) -> bytes:
    """ExtenderArgs for the gCTF fixture pod over n nodes: ``nodes`` (full NodeList) or ``names``
    (one pod: :func:`with_input_size` makes the others)."""
    pod = json.loads((KUBE / "pod_gctf.json").read_text())
    if mode == "names":
        return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": node_names(n)})
    template = json.loads((KUBE / "nodelist.json").read_text())["items"][0]
    items = []
    for name in node_names(n):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        items.append(node)
    return orjson.dumps({"Pod": pod, "Nodes": {"metadata": {"resourceVersion": "1"}, "items": items},
                         "NodeNames": None})


SIZE_ANNOTATION = b'"rttsched.io/input-size-mb":"512"'  # the fixture pod's


def with_input_size(body: bytes, i: int) -> bytes:
    """``body`` (from :func:`payload`) for the ``i``-th pod: its own input size (256.000-1279.999 MB).

    Every request is a different pod, as in a cluster: the predictor remembers rows it has seen
    (:mod:`app.model.fast`), and the same pod again and again would measure its memory, not the decision.
    """
    size = 256.0 + (i * 7919) % 1_024_000 / 1000.0
    return body.replace(SIZE_ANNOTATION, b'"rttsched.io/input-size-mb":"%.3f"' % size, 1)


def ours(service: ExtenderService, body: bytes, iters: int, first: int = 0) -> tuple[list[float], list[int]]:
    """Seconds per prioritize as the handler runs it: decode, decide, encode; and the last scores.
    Repetition ``i`` is the pod ``with_input_size(body, first + i)``."""
    out, answer = [], b"[]"
    for i in range(first, first + iters):
        request = with_input_size(body, i)
        t0 = time.perf_counter()
        answer = service.prioritize(parse_args(request))
        out.append(time.perf_counter() - t0)
        service.assumed.forget(POD_UID)
    return out, [r["Score"] for r in orjson.loads(answer)]


def baseline(booster: Any, rows_of: dict[str, dict[str, float]], body: bytes, iters: int,
             per_node: bool) -> tuple[list[float], list[int]]:
    """The baselines of the module docstring: seconds per request and the last scores (the pods of :func:`ours`)."""
    out: list[float] = []
    scores: list[int] = []
    for i in range(iters):
        request = with_input_size(body, i)
        t0 = time.perf_counter()
        doc = orjson.loads(request)
        nodes = doc.get("Nodes")
        names = [it["metadata"]["name"] for it in nodes["items"]] if nodes else doc["NodeNames"]
        size = float(doc["Pod"]["metadata"]["annotations"]["rttsched.io/input-size-mb"])
        X = np.stack([row({**rows_of[n], "task_input_size_mb": size}, FEATURES) for n in names])
        if per_node:
            rtt = np.array([booster.inplace_predict(X[i:i + 1])[0] for i in range(len(names))])
        else:
            rtt = booster.inplace_predict(X)
        scores = score_nodes(rtt, [CREDIBILITY] * len(names)).tolist()
        orjson.dumps([{"Host": h, "Score": s} for h, s in zip(names, scores, strict=True)])
        out.append(time.perf_counter() - t0)
    return out, scores


def baseline_rows(features: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The baseline's view: each node's feature dict (metrics + hardware descriptors), as the builder makes it."""
    return {v["node"]: node_features_map(v) for v in features}


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q)) if samples else float("nan")
