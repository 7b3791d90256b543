"""kube-scheduler extender protocol v1 (``k8s.io/kube-scheduler/extender/v1``) on the wire.

The Go structs carry no JSON tags, so the keys are the Go field names::

    ExtenderArgs          {"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}
    ExtenderFilterResult  {"Nodes", "NodeNames", "FailedNodes": {name: reason},
                           "FailedAndUnresolvableNodes": {name: reason}, "Error": string}
    HostPriorityList      [{"Host": string, "Score": int 0..10}]

kube-scheduler sends ``Nodes`` (full objects) when the extender is not ``nodeCacheCapable`` and expects
``Nodes`` back; it sends ``NodeNames`` when it is and expects ``NodeNames`` back. Go's decoder matches keys
case-insensitively, and so does :func:`parse_args` for the top-level keys.

>>> a = parse_args(b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": null, "NodeNames": ["n1", "n2"]}')
>>> a.node_names, a.node_items is None
(['n1', 'n2'], True)
>>> parse_args(b'{"Pod": {}, "NodeNames": [1]}')
Traceback (most recent call last):
...
app.extender.protocol.ProtocolError: NodeNames[0] must be a string (got int)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from app.errors import RttError


class ProtocolError(RttError, ValueError):
    """The request body is not an ExtenderArgs (HTTP 400 with ``Error`` set)."""


@dataclasses.dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str]  # candidates, in the order received
    node_items: list[dict[str, Any]] | None  # full Node objects when sent as a NodeList, else None
    node_list: dict[str, Any] | None  # the NodeList itself (its metadata is echoed back)


def _field(doc: Mapping[str, Any], name: str) -> Any:
    if name in doc:
        return doc[name]
    low = name.lower()
    for k, v in doc.items():
        if k.lower() == low:
            return v
    return None


def _node_name(item: Any, i: int) -> str:
    if not isinstance(item, dict):
        raise ProtocolError(f"Nodes.items[{i}] must be an object (got {type(item).__name__})")
    meta = item.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ProtocolError(f"Nodes.items[{i}].metadata.name must be a non-empty string")
    return str(meta["name"])


def parse_args(body: bytes) -> ExtenderArgs:
    """Decode and check an ExtenderArgs body; :class:`ProtocolError` says what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"body must be a JSON object (ExtenderArgs), got {type(doc).__name__}")
    pod = _field(doc, "Pod")
    if not isinstance(pod, dict):
        raise ProtocolError("Pod is required and must be an object" if pod is None else
                            f"Pod must be an object (got {type(pod).__name__})")
    node_list = _field(doc, "Nodes")
    names_raw = _field(doc, "NodeNames")
    if node_list is not None:
        if not isinstance(node_list, dict):
            raise ProtocolError(f"Nodes must be a NodeList object or null (got {type(node_list).__name__})")
        meta = node_list.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise ProtocolError(f"Nodes.metadata must be an object (got {type(meta).__name__})")
        items = node_list.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise ProtocolError(f"Nodes.items must be an array (got {type(items).__name__})")
        return ExtenderArgs(pod, [_node_name(it, i) for i, it in enumerate(items)], items, node_list)
    if names_raw is None:
        return ExtenderArgs(pod, [], None, None)
    if not isinstance(names_raw, list):
        raise ProtocolError(f"NodeNames must be an array of strings or null (got {type(names_raw).__name__})")
    for i, n in enumerate(names_raw):
        if not isinstance(n, str):
            raise ProtocolError(f"NodeNames[{i}] must be a string (got {type(n).__name__})")
    return ExtenderArgs(pod, names_raw, None, None)


def filter_result(args: ExtenderArgs, failed: Mapping[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult in the request's mode: the candidates not in ``failed``, in their order."""
    nodes: dict[str, Any] | None = None
    names: list[str] | None = None
    if args.node_items is not None:
        kept = [it for it, n in zip(args.node_items, args.node_names, strict=True) if n not in failed]
        nodes = {**(args.node_list or {}), "items": kept}
    else:
        names = [n for n in args.node_names if n not in failed]
    return {"Nodes": nodes, "NodeNames": names, "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": {}, "Error": error}


def error_result(message: str) -> dict[str, Any]:
    """The body of an error answer: a filter result with nothing in it and ``Error`` set."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def priority_list(scores: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList: ``[{"Host": name, "Score": int}]``."""
    return [{"Host": host, "Score": int(score)} for host, score in scores]
