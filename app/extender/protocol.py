"""kube-scheduler extender protocol v1 (``k8s.io/kube-scheduler/extender/v1``) on the wire.

The Go structs carry no JSON tags, so the keys are the Go field names::

    ExtenderArgs          {"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}
    ExtenderFilterResult  {"Nodes", "NodeNames", "FailedNodes": {name: reason},
                           "FailedAndUnresolvableNodes": {name: reason}, "Error": string}
    HostPriorityList      [{"Host": string, "Score": int 0..10}]

kube-scheduler sends ``Nodes`` (full objects) when the extender is not ``nodeCacheCapable`` and expects
``Nodes`` back; it sends ``NodeNames`` when it is and expects ``NodeNames`` back. Go's decoder matches keys
case-insensitively, and so does :func:`parse_args` for the top-level keys.

A typed decoder (msgspec) reads only what a decision needs — the pod's name, namespace, uid, labels and
annotations, and the candidates' names — and skips everything else while checking that it is valid JSON.
The filter verb also keeps the NodeList as received (``msgspec.Raw``): it is echoed back unchanged when every
node passes, and only split into items when some fail.

>>> a = parse_args(b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": null, "NodeNames": ["n1", "n2"]}')
>>> a.node_names, a.node_list, a.pod.name
(['n1', 'n2'], False, 'p')
>>> parse_args(b'{"Pod": {}, "NodeNames": [1]}')
Traceback (most recent call last):
...
app.extender.protocol.ProtocolError: NodeNames[0] must be a string (got int)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec
import orjson

from app.errors import RttError
from app.scheduler.podinfo import PodInfo, pod_from_metadata


class ProtocolError(RttError, ValueError):
    """The request body is not an ExtenderArgs (HTTP 400 with ``Error`` set)."""


# -- what is decoded: the rest of a Pod / Node is skipped
class _Metadata(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Pod(msgspec.Struct):
    metadata: _Metadata | None = None


_NodeName = Annotated[str, msgspec.Meta(min_length=1)]


class _NodeMetadata(msgspec.Struct):
    name: _NodeName


class _Node(msgspec.Struct):
    metadata: _NodeMetadata


class _NodeList(msgspec.Struct):
    metadata: dict[str, msgspec.Raw] | None = None
    items: list[_Node] | None = None


_Unset = msgspec.UnsetType


class _Args(msgspec.Struct):
    Pod: _Pod | None | _Unset = msgspec.UNSET
    Nodes: _NodeList | None | _Unset = msgspec.UNSET
    NodeNames: list[_NodeName] | None | _Unset = msgspec.UNSET


class _ArgsKeepNodes(msgspec.Struct):
    Pod: _Pod | None | _Unset = msgspec.UNSET
    Nodes: msgspec.Raw | _Unset = msgspec.UNSET
    NodeNames: list[_NodeName] | None | _Unset = msgspec.UNSET


_DECODE_ARGS = msgspec.json.Decoder(_Args)
_DECODE_ARGS_KEEP = msgspec.json.Decoder(_ArgsKeepNodes)
_DECODE_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_DECODE_POD = msgspec.json.Decoder(_Pod | None)
_DECODE_NODES = msgspec.json.Decoder(_NodeList | None)
_DECODE_NAMES = msgspec.json.Decoder(list[_NodeName] | None)
_DECODE_NODELIST_RAW = msgspec.json.Decoder(dict[str, msgspec.Raw])
_DECODE_ITEMS_RAW = msgspec.json.Decoder(list[msgspec.Raw] | None)
_ENCODE = msgspec.json.Encoder()

_KINDS = {"object": "an object", "array": "an array", "str": "a string", "int": "an integer", "float": "a number",
          "bool": "a boolean", "null": "null"}
_TOP = {"Pod": "an object", "Nodes": "a NodeList object or null", "NodeNames": "an array of strings or null"}


@dataclasses.dataclass(frozen=True)
class ExtenderArgs:
    pod: PodInfo
    node_names: list[str]  # candidates, in the order received
    node_list: bool  # sent as a NodeList (nodeCacheCapable: false): the filter answers with Node objects
    nodes_raw: msgspec.Raw | None = None  # the NodeList as received (only when decoded with keep_nodes)


def _kind(expected: str) -> str:
    return " or ".join(_KINDS.get(k.strip(), k.strip()) for k in expected.split("|"))


def _problem(exc: msgspec.ValidationError, prefix: str) -> ProtocolError:
    """A ProtocolError naming the field the way the API does (``Nodes.items[0].metadata.name``)."""
    text, _, at = str(exc).rpartition(" - at `$")
    if not text:
        text, at = str(exc), "`"
    path = (prefix + at[:-1]).lstrip(".") or "body"
    if text.startswith("Expected `") and "`, got `" in text:
        expected, got = text[len("Expected `"):].split("`, got `", 1)
        got = got.rstrip("`")
        if path == "body":
            return ProtocolError(f"body must be a JSON object (ExtenderArgs), got {got}")
        return ProtocolError(f"{path} must be {_TOP.get(path) or _kind(expected)} (got {got})")
    if text.startswith("Object missing required field `"):
        return ProtocolError(f"{path}.{text.split('`')[1]} is required")
    if text.startswith("Expected `str` of length >= 1"):
        return ProtocolError(f"{path} must be a non-empty string")
    return ProtocolError(f"{path}: {text}")


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes | bytearray | memoryview | msgspec.Raw, prefix: str) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _problem(exc, prefix) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"body is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's own bound on nesting, hit below the interpreter's limit
        raise ProtocolError("body is nested too deeply to be an ExtenderArgs") from None


def _field(doc: Mapping[str, msgspec.Raw], name: str) -> msgspec.Raw | None:
    """Go's rule: the exact key, else the first key equal to it ignoring case."""
    if name in doc:
        return doc[name]
    low = name.lower()
    return next((v for k, v in doc.items() if k.lower() == low), None)


def parse_args(body: bytes | bytearray | memoryview, keep_nodes: bool = False) -> ExtenderArgs:
    """Decode and check an ExtenderArgs body; :class:`ProtocolError` says what is wrong.

    ``keep_nodes`` keeps the NodeList as received, for :func:`filter_body`.
    """
    args = _decode(_DECODE_ARGS_KEEP if keep_nodes else _DECODE_ARGS, body, "")
    pod, nodes, names = args.Pod, args.Nodes, args.NodeNames
    if pod is msgspec.UNSET or nodes is msgspec.UNSET or names is msgspec.UNSET:  # keys in another case?
        doc = _decode(_DECODE_TOP, body, "")
        raw_pod, raw_nodes, raw_names = _field(doc, "Pod"), _field(doc, "Nodes"), _field(doc, "NodeNames")
        pod = None if raw_pod is None else _decode(_DECODE_POD, raw_pod, "Pod")
        nodes = raw_nodes if keep_nodes else None if raw_nodes is None else _decode(_DECODE_NODES, raw_nodes, "Nodes")
        names = None if raw_names is None else _decode(_DECODE_NAMES, raw_names, "NodeNames")
    if pod is None:
        raise ProtocolError("Pod is required and must be an object")
    nodes_raw = None
    if keep_nodes and nodes is not None:
        nodes_raw = nodes
        nodes = _decode(_DECODE_NODES, nodes, "Nodes")
    if nodes is not None:
        return ExtenderArgs(_pod_info(pod), [it.metadata.name for it in nodes.items or ()], True, nodes_raw)
    return ExtenderArgs(_pod_info(pod), names or [], False)


def _pod_info(pod: _Pod) -> PodInfo:
    m = pod.metadata
    if m is None:
        return pod_from_metadata("", "", "", {}, {})
    return pod_from_metadata(m.name or "", m.namespace or "", m.uid or "", m.labels or {}, m.annotations or {})


def filter_body(args: ExtenderArgs, failed: Mapping[str, str], error: str = "") -> bytes:
    """ExtenderFilterResult in the request's mode: the candidates not in ``failed``, in their order.

    In NodeList mode the Node objects go back as received (decode with ``keep_nodes``); when none failed,
    the NodeList itself is echoed without being split into items.
    """
    nodes: Any = None
    names: list[str] | None = None
    if args.node_list:
        if args.nodes_raw is None:
            raise ValueError("filter_body needs the NodeList: decode the request with keep_nodes=True")
        nodes = args.nodes_raw
        if failed:
            doc = _DECODE_NODELIST_RAW.decode(args.nodes_raw)
            items = _DECODE_ITEMS_RAW.decode(doc["items"]) if "items" in doc else None
            kept = [it for it, n in zip(items or (), args.node_names, strict=True) if n not in failed]
            nodes = {**doc, "items": kept}
    else:
        names = [n for n in args.node_names if n not in failed]
    return _ENCODE.encode({"Nodes": nodes, "NodeNames": names, "FailedNodes": dict(failed),
                           "FailedAndUnresolvableNodes": {}, "Error": error})


def error_result(message: str) -> dict[str, Any]:
    """The body of an error answer: a filter result with nothing in it and ``Error`` set."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def error_body(message: str) -> bytes:
    return orjson.dumps(error_result(message))


def priority_list(scores: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList: ``[{"Host": name, "Score": int}]``."""
    return [{"Host": host, "Score": int(score)} for host, score in scores]


_HOST_PARTS: dict[str, bytes] = {}  # node name -> its entry up to the score (names recur on every request)
_SCORE_PARTS = tuple(b"%d}" % s for s in range(101))
_SCORES = dict(enumerate(_SCORE_PARTS))  # the same, looked up by score: a score outside 0..100 is a KeyError


def _host_part(host: str) -> bytes:
    if len(_HOST_PARTS) >= 65_536:
        _HOST_PARTS.clear()
    part = _HOST_PARTS[host] = b'{"Host":' + orjson.dumps(host) + b',"Score":'
    return part


def priority_body(scores: Sequence[tuple[str, int]]) -> bytes:
    """:func:`priority_list` as JSON, written from each node's part (made once) and its score's.

    >>> priority_body([("n1", 10), ("gpu-\u00e9", 0), ("n3", 250)])
    b'[{"Host":"n1","Score":10},{"Host":"gpu-\xc3\xa9","Score":0},{"Host":"n3","Score":250}]'
    """
    get, parts = _HOST_PARTS.get, _SCORE_PARTS
    return b"[" + b",".join([(get(h) or _host_part(h)) + (parts[s] if 0 <= s <= 100 else b"%d}" % s)
                             for h, s in scores]) + b"]"


def priority_body_of(nodes: tuple[str, ...], scores: Sequence[int]) -> bytes:
    """:func:`priority_body` of ``zip(nodes, scores)``, with the node list's parts kept per list
    (kube-scheduler sends the same list pod after pod).

    >>> priority_body_of(("n1", "n2"), [10, 250]) == priority_body([("n1", 10), ("n2", 250)])
    True
    """
    if len(nodes) != len(scores):
        raise ValueError(f"{len(nodes)} nodes, {len(scores)} scores")
    parts = _SCORES
    try:
        return b"[" + b",".join([h + parts[s] for h, s in zip(_list_parts(nodes), scores, strict=True)]) + b"]"
    except KeyError:  # a score outside 0..100
        return priority_body(list(zip(nodes, scores, strict=True)))


@functools.lru_cache(maxsize=16)
def _list_parts(nodes: tuple[str, ...]) -> tuple[bytes, ...]:
    get = _HOST_PARTS.get
    return tuple(get(h) or _host_part(h) for h in nodes)
