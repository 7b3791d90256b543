"""rtt-predictions values: one per fresh candidate of a scored answer (key = node), as dicts or encoded records.

``predicted_rtt_ms`` is the model's prediction times the node's residual correction (before the contention
penalty), null for a candidate no model covers yet: its task features still make its training sample
complete (:meth:`~app.scheduler.decide.Decision.published`); ``correction`` says which factor was applied
when it is not 1. ``chosen: true`` marks the candidate the extender assumed the pod on (the ``chosen``
arguments below: :meth:`~app.scheduler.decide.Decision.best` after prioritize, the single passing node after
filter), absent on the others: the worker's join keeps that prediction when it must let predictions go early.


The publisher encodes tens to thousands of records per scored request, so the JSON is written from
fragments: the parts common to the request (task, app, ts) once, the model's part once per model, a features
map once per distinct map (most candidates share the map of a node with nothing running), and only the node
and its prediction per record. It produces the same values as :func:`prediction_value` (a test decodes both
through the contract).

It happens in two steps. :func:`prepare` runs when the request is answered and keeps what the records need
as bytes, strings, numpy arrays and plain tuples of those: the garbage collector stops traversing such a
tuple after its first pass or two over it. A queued :class:`~app.scheduler.decide.Decision` instead holds a dozen
lists of one reference per candidate, traversed by every pass for as long as it waits, and a publisher
behind a burst of requests holds thousands of them (passes of 10-140 ms were measured with 7,000 queued
at 64 nodes). :func:`encode_prepared` then writes the records, in the publisher's background slices.

>>> from app.scheduler.podinfo import PodInfo
>>> d = Decision(PodInfo("p", "ns", "uid-1", "gCTF", 1.0), ("n1", "n2"), [10, 5], [100.0, float("nan")],
...              ["gCTF:gpu", None], [3, None], [1.0, 1.0], [None, None], [True, True])
>>> [(k, orjson.loads(v)["predicted_rtt_ms"]) for part in encode_decision(d, 1.0) for k, v in part]
[(b'n1', 100.0), (b'n2', None)]
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from app.contracts import contract
from app.scheduler.decide import Decision, NodeVerdict

Record = tuple[bytes, bytes]  # key, value
# head, nodes, predictions, model parts, each node's model part, feature-map parts, each node's map part,
# corrections (None: all 1), the chosen node's place in nodes (-1: none)
Prepared = tuple[bytes, tuple[str, ...], np.ndarray, tuple[bytes, ...], np.ndarray, tuple[bytes, ...], np.ndarray,
                 np.ndarray | None, int]
_dumps = orjson.dumps
# the contract's bound on a prediction: a larger one (an absurd model times a correction) is sent at the bound
MAX_PREDICTED_MS = float(contract("rtt-predictions").value_schema["properties"]["predicted_rtt_ms"]["maximum"])


def prediction_value(task_id: str, app: str, node: str, ts: float, rtt_ms: float, model_version: int | None,
                     model_key: str | None, features: Mapping[str, float] | None,
                     correction: float = 1.0, chosen: bool = False) -> dict[str, Any]:
    """One rtt-predictions value; a candidate's task features that node-features cannot supply
    (``running_pods_<app>``) go in ``features``; a NaN prediction is null; ``chosen`` only when true."""
    value: dict[str, Any] = {"task_id": task_id, "app": app, "node": node, "ts": ts,
                             "predicted_rtt_ms": min(rtt_ms, MAX_PREDICTED_MS) if math.isfinite(rtt_ms) else None,
                             "model_version": model_version, "model_key": model_key}
    if features:
        value["features"] = dict(features)
    if correction != 1.0:
        value["correction"] = correction
    if chosen:
        value["chosen"] = True
    return value


def prediction_values(task_id: str, app: str, ts: float, verdicts: Sequence[NodeVerdict],
                      chosen: str | None = None) -> list[dict[str, Any]]:
    """The rtt-predictions values of ``verdicts`` (:meth:`Decision.published`); ``chosen``: the node the pod
    was assumed on."""
    return [prediction_value(task_id, app, v.node, ts, v.predicted_rtt_ms, v.model_version, v.model_key, v.features,
                             v.correction, v.node == chosen) for v in verdicts]


def _published(decision: Decision) -> list[int]:
    """Candidates :meth:`Decision.published` covers: the fresh ones of a scored answer."""
    if decision.neutral is not None:
        return []
    return [i for i, fresh in enumerate(decision.fresh) if fresh]


def decision_values(decision: Decision, ts: float, chosen: str | None = None) -> Iterator[dict[str, Any]]:
    """The values of one request as dicts, in candidate order (:meth:`Decision.published`); ``chosen``: the node
    the pod was assumed on (its first place among the candidates)."""
    task_id, app = decision.pod.task_id, decision.pod.app or ""
    rtts = decision.model_rtt_ms or decision.rtt_ms
    features = decision.features
    corr = decision.correction
    at = _place(decision, chosen)
    for i in _published(decision):
        yield prediction_value(task_id, app, decision.nodes[i], ts, rtts[i], decision.model_version[i],
                               decision.model_key[i], features[i] if features else None, corr[i] if corr else 1.0,
                               i == at)


def _place(decision: Decision, node: str | None) -> int:
    """The place of ``node`` among the decision's candidates: its winner's when it is that node, else the first
    (-1: None or not a candidate)."""
    if node is None:
        return -1
    w = decision.winner
    if w is not None and decision.nodes[w] == node:
        return w
    try:
        return decision.nodes.index(node)
    except ValueError:
        return -1


def prepare(decision: Decision, ts: float, chosen: str | None = None) -> Prepared | None:
    """What the publisher needs of one request (None: nothing to publish), held as objects the garbage
    collector soon stops traversing (module docstring); the parts common to several candidates are encoded
    here, once. ``chosen``: the node the pod was assumed on (:func:`decision_values`)."""
    if decision.neutral is not None or not decision.nodes:
        return None
    every = len(decision.fresh) == len(decision.nodes) and False not in decision.fresh
    published = range(len(decision.nodes)) if every else _published(decision)
    if not published:
        return None
    head = b'{"task_id":%s,"app":%s,"ts":%s,"node":' % (
        _dumps(decision.pod.task_id), _dumps(decision.pod.app or ""), _dumps(ts))
    rtts = decision.model_rtt_ms or decision.rtt_ms
    nodes, keys, versions = decision.nodes, decision.model_key, decision.model_version
    features: Sequence[Mapping[str, float] | None] = decision.features or [None] * len(nodes)
    corr = decision.correction
    at = _place(decision, chosen)
    if not every:  # its place among the published candidates (in order)
        j = bisect.bisect_left(published, at)
        at = j if at >= 0 and j < len(published) and published[j] == at else -1
        nodes, rtts, keys, versions = (tuple(nodes[i] for i in published), [rtts[i] for i in published],
                                       [keys[i] for i in published], [versions[i] for i in published])
        features, corr = [features[i] for i in published], [corr[i] for i in published] if corr else corr
    n = len(nodes)
    if keys.count(keys[0]) == n and versions.count(versions[0]) == n:  # one model (the usual case)
        models, model_of = [(keys[0], versions[0])], None
    else:
        pairs = list(zip(keys, versions, strict=True))
        slot = {m: j for j, m in enumerate(dict.fromkeys(pairs))}
        models, model_of = list(slot), [slot[m] for m in pairs]
    ids = list(map(id, features))
    map_of: list[int] | None = None
    if ids.count(ids[0]) == n:  # candidates with nothing running share one map
        maps = [features[0]]
    else:
        slots = {key: j for j, key in enumerate(dict.fromkeys(ids))}
        maps, map_of = list(dict(zip(ids, features, strict=True)).values()), [slots[i] for i in ids]
    rtt = np.array(rtts, dtype=np.float64)
    np.copyto(rtt, MAX_PREDICTED_MS, where=np.isfinite(rtt) & (rtt > MAX_PREDICTED_MS))
    return (head, nodes, rtt,
            tuple([b',"model_version":%s,"model_key":%s' % (_dumps(v), _dumps(k)) for k, v in models]),
            _slots(model_of, n), tuple([b',"features":' + _dumps(dict(f)) if f else b"" for f in maps]),
            _slots(map_of, n), np.array(corr, dtype=np.float64) if corr and corr.count(1.0) != n else None, at)


def _slots(slots: list[int] | None, n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int32) if slots is None else np.array(slots, dtype=np.int32)


def prepared_count(prepared: Prepared) -> int:
    """How many records :func:`encode_prepared` makes of ``prepared``."""
    return len(prepared[1])


def encode_prepared(prepared: Prepared, chunk: int = 128) -> Iterator[list[Record]]:
    """The (key, JSON value) records of a request as :func:`prepare` kept it, in candidate order, in lists
    covering at most ``chunk`` candidates each (so that a caller can pace thousands of them).

    The predictions are written as JSON in one call (a list's items, split at their commas: a number has
    none; NaN and infinities become ``null``), and where every candidate shares one model and one feature
    map and has no correction, each value is three joins of parts made once; the chosen candidate's value then
    gets its mark.
    """
    head, nodes, rtts, model_parts, model_of, map_parts, map_of, corr, chosen = prepared
    rtt_parts = _dumps(rtts.tolist())[1:-1].split(b",") if len(nodes) else []
    corrs = corr.tolist() if corr is not None else None
    shared = corrs is None and len(model_parts) == 1 and len(map_parts) == 1
    tail = model_parts[0] + map_parts[0] + b"}" if shared else b""
    models, maps = model_of.tolist(), map_of.tolist()
    join = b"".join
    for start in range(0, len(nodes), chunk):
        stop = min(start + chunk, len(nodes))
        if shared:
            out = [(key, join((head, node, rtt_parts[i], tail)))
                   for i, (key, node) in zip(range(start, stop), map(_node_parts, nodes[start:stop]), strict=True)]
        else:
            out = []
            for i in range(start, stop):
                key, node = _node_parts(nodes[i])
                c = corrs[i] if corrs is not None else 1.0
                out.append((key, join((head, node, rtt_parts[i], model_parts[models[i]], map_parts[maps[i]],
                                       b',"correction":' + _dumps(c) + b"}" if c != 1.0 else b"}"))))
        if start <= chosen < stop:
            key, value = out[chosen - start]
            out[chosen - start] = (key, value[:-1] + b',"chosen":true}')
        yield out


def encode_decision(decision: Decision, ts: float, chunk: int = 128,
                    chosen: str | None = None) -> Iterator[list[Record]]:
    """:func:`decision_values` as (key, JSON value) records: :func:`encode_prepared` of :func:`prepare`."""
    prepared = prepare(decision, ts, chosen)
    if prepared is not None:
        yield from encode_prepared(prepared, chunk)


@functools.lru_cache(maxsize=65_536)
def _node_parts(node: str) -> tuple[bytes, bytes]:
    """A node's record key and its part of the value up to the prediction (node names recur on every request)."""
    return node.encode(), _dumps(node) + b',"predicted_rtt_ms":'
