"""rtt-predictions values: one per fresh candidate of a scored answer (key = node), as dicts or encoded records.

``predicted_rtt_ms`` is the model's prediction times the node's residual correction (before the contention
penalty), null for a candidate no model covers yet: its task features still make its training sample
complete (:meth:`~app.scheduler.decide.Decision.published`); ``correction`` says which factor was applied
when it is not 1.


:func:`encode_decision` is what the publisher runs for every scored request — tens to thousands of records
per request — so it writes the JSON from fragments: the parts common to the request (task, app, ts) once,
the model's part once per model, a features map once per distinct map (most candidates share the map of a
node with nothing running), and only the node and its prediction per record. It produces the same values as
:func:`prediction_value` (a test decodes both through the contract).

>>> from app.scheduler.podinfo import PodInfo
>>> d = Decision(PodInfo("p", "ns", "uid-1", "gCTF", 1.0), ("n1", "n2"), [10, 5], [100.0, float("nan")],
...              ["gCTF:gpu", None], [3, None], [1.0, 1.0], [None, None], [True, True])
>>> [(k, orjson.loads(v)["predicted_rtt_ms"]) for part in encode_decision(d, 1.0) for k, v in part]
[(b'n1', 100.0), (b'n2', None)]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from app.scheduler.decide import Decision, NodeVerdict

Record = tuple[bytes, bytes]  # key, value
_dumps = orjson.dumps


def prediction_value(task_id: str, app: str, node: str, ts: float, rtt_ms: float, model_version: int | None,
                     model_key: str | None, features: Mapping[str, float] | None,
                     correction: float = 1.0) -> dict[str, Any]:
    """One rtt-predictions value; a candidate's task features that node-features cannot supply
    (``running_pods_<app>``) go in ``features``; a NaN prediction is null."""
    value: dict[str, Any] = {"task_id": task_id, "app": app, "node": node, "ts": ts,
                             "predicted_rtt_ms": rtt_ms if math.isfinite(rtt_ms) else None,
                             "model_version": model_version, "model_key": model_key}
    if features:
        value["features"] = dict(features)
    if correction != 1.0:
        value["correction"] = correction
    return value


def prediction_values(task_id: str, app: str, ts: float, verdicts: Sequence[NodeVerdict]) -> list[dict[str, Any]]:
    """The rtt-predictions values of ``verdicts`` (:meth:`Decision.published`)."""
    return [prediction_value(task_id, app, v.node, ts, v.predicted_rtt_ms, v.model_version, v.model_key, v.features,
                             v.correction) for v in verdicts]


def _published(decision: Decision) -> list[int]:
    """Candidates :meth:`Decision.published` covers: the fresh ones of a scored answer."""
    if decision.neutral is not None:
        return []
    return [i for i, fresh in enumerate(decision.fresh) if fresh]


def decision_values(decision: Decision, ts: float) -> Iterator[dict[str, Any]]:
    """The values of one request as dicts, in candidate order (:meth:`Decision.published`)."""
    task_id, app = decision.pod.task_id, decision.pod.app or ""
    rtts = decision.model_rtt_ms or decision.rtt_ms
    features = decision.features
    corr = decision.correction
    for i in _published(decision):
        yield prediction_value(task_id, app, decision.nodes[i], ts, rtts[i], decision.model_version[i],
                               decision.model_key[i], features[i] if features else None, corr[i] if corr else 1.0)


def encode_decision(decision: Decision, ts: float, chunk: int = 128) -> Iterator[list[Record]]:
    """:func:`decision_values` as (key, JSON value) records, built from fragments (see the module docstring),
    in lists covering at most ``chunk`` candidates each (so that a caller can pace thousands of them)."""
    head = b'{"task_id":%s,"app":%s,"ts":%s,"node":' % (
        _dumps(decision.pod.task_id), _dumps(decision.pod.app or ""), _dumps(ts))
    rtts = decision.model_rtt_ms or decision.rtt_ms
    features = decision.features
    keys, versions, nodes = decision.model_key, decision.model_version, decision.nodes
    corr = decision.correction
    models: dict[tuple[str | None, int | None], bytes] = {}
    maps: dict[int, bytes] = {id(None): b""}
    isfinite = math.isfinite
    published = _published(decision)
    for start in range(0, len(published), chunk):
        out: list[Record] = []
        for i in published[start:start + chunk]:
            rtt = rtts[i]
            model = models.get((keys[i], versions[i]))
            if model is None:
                model = models[(keys[i], versions[i])] = b',"model_version":%s,"model_key":%s' % (
                    _dumps(versions[i]), _dumps(keys[i]))
            fmap = features[i] if features else None
            feat = maps.get(id(fmap))
            if feat is None:
                feat = maps[id(fmap)] = b',"features":' + _dumps(dict(fmap)) if fmap else b""
            key, node = _node_parts(nodes[i])
            c = corr[i] if corr else 1.0
            out.append((key, b"".join((head, node, _dumps(rtt if isfinite(rtt) else None), model, feat,
                                       b',"correction":' + _dumps(c) + b"}" if c != 1.0 else b"}"))))
        yield out


@functools.lru_cache(maxsize=65_536)
def _node_parts(node: str) -> tuple[bytes, bytes]:
    """A node's record key and its part of the value up to the prediction (node names recur on every request)."""
    return node.encode(), _dumps(node) + b',"predicted_rtt_ms":'
