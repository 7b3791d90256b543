"""Scrape targets: which exporter endpoints belong to which node, from ``--target`` flags or a YAML file.

A flag names one node: ``node=worker-1,class=gpu,url=http://h:9100/metrics,url=http://h:9400/metrics``
(``class`` and ``gpu_model`` are optional; ``exporter=NAME`` after a ``url=`` declares that endpoint's exporter).
A targets file is either one node (what the DaemonSet in ``k8s/`` mounts) or a list of nodes; ``${VAR}`` is
replaced by the environment variable ``VAR``::

    node: ${NODE_NAME}
    targets:
      - {exporter: node_exporter, url: "http://${NODE_IP}:9100/metrics"}
      - {exporter: dcgm_exporter, url: "http://${NODE_IP}:9400/metrics", optional: true}

    nodes:
      - {node: worker-1, class: gpu, targets: ["http://10.0.0.11:9100/metrics", "http://10.0.0.11:9400/metrics"]}

An ``optional`` endpoint that has never answered is not trouble (a CPU node without a GPU exporter). A node
is named as Kubernetes names it (an RFC 1123 subdomain; any other name could never match a node of the
cluster), and a declared exporter must be one of the mapping's (``node_exporter``,
``dcgm_exporter``, ``nvidia_gpu_exporter``).

>>> parse_target_flag("node=w1,class=gpu,url=http://h:9100/metrics,url=http://h:9400/metrics").urls
('http://h:9100/metrics', 'http://h:9400/metrics')
>>> parse_target_flag("node=w1")
Traceback (most recent call last):
...
app.bridge.errors.TargetError: --target 'node=w1': at least one url= is required
>>> parse_target_flag("node=w1,url=http://h:19100/metrics,exporter=node_exporter").endpoints[0].exporter
'node_exporter'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from app.bridge.errors import TargetError
from app.bridge.mapping import load_mapping
from app.errors import read_error
from app.listen import url_host

NODE_CLASSES = ("cpu", "gpu")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# a Kubernetes node name: an RFC 1123 subdomain (k8s.io/apimachinery IsDNS1123Subdomain), at most 253 characters
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
NODE_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
NODE_NAME_MAX = 253


@dataclasses.dataclass(frozen=True)
class Endpoint:
    url: str
    exporter: str | None = None
    optional: bool = False

    @property
    def port(self) -> int | None:
        return urlsplit(self.url).port


@dataclasses.dataclass(frozen=True)
class Target:
    """One node and its exporter endpoints. ``node_class`` None = inferred from the exporters that answer."""

    node: str
    endpoints: tuple[Endpoint, ...]
    node_class: str | None = None
    gpu_model: str | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(e.url for e in self.endpoints)


_NODE_KEYS = ("node", "class", "gpu_model", "targets", "urls")
_ENDPOINT_KEYS = ("url", "exporter", "optional")


def _check_url(where: str, url: str) -> str:
    try:  # urlsplit raises on a bad [IPv6] address, .port on a port that is no number or out of range
        parts = urlsplit(url)
        parts.port  # noqa: B018
    except ValueError as exc:
        raise TargetError(where, f"{url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(where, f"{url!r} is not an http(s) URL")
    return url


def _known(where: str, raw: Mapping[Any, Any], known: Sequence[str]) -> None:
    """A key of a file's mapping that is not in ``known`` is an error naming it (a typo is never ignored)."""
    for key in raw:
        if key not in known:
            raise TargetError(f"{where}.{key}", f"unknown key (known: {', '.join(known)})")


def _at(where: str, key: str) -> str:
    """A key of a target: ``targets.yaml[0].class`` in a file, ``--target 'node=...', class`` in a flag."""
    return f"{where}, {key}" if where.startswith("--") else f"{where}.{key}"


def _unexpanded(where: str, value: str) -> TargetError:
    """The error for a ``$VAR`` / ``${VAR}`` left in a flag (which the shell did not expand) or in a file."""
    var = re.search(r"\$\{[^}]*\}?|\$\w+", value)
    text = var.group(0) if var else value
    if where.startswith("--"):
        return TargetError(where, f"{text} is not expanded in --target: give the value, or use a targets file")
    return TargetError(where, f"{text} is not expanded: a targets file expands ${{NAME}} only, NAME made of "
                              "letters, digits and _")


def check_node_name(where: str, node: Any) -> str:
    """``node`` if it is a Kubernetes node name, else a :class:`TargetError` at ``where`` saying why."""
    if isinstance(node, str) and len(node) <= NODE_NAME_MAX and NODE_NAME.fullmatch(node):
        return node
    if isinstance(node, str) and "$" in node:
        raise _unexpanded(where, node)
    raise TargetError(where, "must be a Kubernetes node name: lowercase letters, digits, '-' and '.', at most "
                             f"{NODE_NAME_MAX} characters, a letter or digit at each end (got {node!r})")


def known_exporters() -> tuple[str, ...]:
    """The exporters of the built-in mapping."""
    return tuple(load_mapping().exporters)


def check_exporter(where: str, exporter: Any, known: Collection[str]) -> str:
    """``exporter`` if it is one of ``known``, else a :class:`TargetError` at ``where`` listing them."""
    if not isinstance(exporter, str):
        raise TargetError(where, f"must be a string (got {exporter!r})")
    if exporter not in known:
        raise TargetError(where, f"unknown exporter {exporter!r} (known: {', '.join(known)})")
    return exporter


def _make(where: str, node: Any, node_class: Any, gpu_model: Any, endpoints: Sequence[Endpoint]) -> Target:
    check_node_name(_at(where, "node"), node)
    if node_class is not None and node_class not in NODE_CLASSES:
        raise TargetError(_at(where, "class"), f"must be one of {list(NODE_CLASSES)} (got {node_class!r})")
    if gpu_model is not None and not isinstance(gpu_model, str):
        raise TargetError(_at(where, "gpu_model"), f"must be a string (got {gpu_model!r})")
    if not endpoints:
        raise TargetError(where, "at least one url= is required" if where.startswith("--") else "no targets")
    urls = [e.url for e in endpoints]
    if len(set(urls)) != len(urls):
        raise TargetError(where, "the same url is listed twice")
    return Target(node, tuple(endpoints), node_class, gpu_model or None)


def parse_target_flag(flag: str, exporters: Collection[str] | None = None) -> Target:
    """``node=NAME[,class=cpu|gpu][,gpu_model=MODEL],url=URL[,exporter=NAME][,url=URL[,exporter=NAME]...]``.

    ``exporter=`` declares the exporter of the ``url=`` before it; ``exporters``: the names it may take
    (default: the built-in mapping's). ``${VAR}`` is not expanded here (only in a targets file).
    """
    where = f"--target {flag!r}"
    fields: dict[str, str] = {}
    urls: list[Endpoint] = []
    for part in flag.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise TargetError(where, f"expected key=value, got {part!r}")
        if key == "url":
            if "${" in value:
                raise _unexpanded(where, value)
            urls.append(Endpoint(_check_url(where, value)))
        elif key == "exporter":
            if not urls:
                raise TargetError(_at(where, "exporter"), "must follow the url= whose exporter it names")
            if urls[-1].exporter is not None:
                raise TargetError(_at(where, "exporter"), f"given twice for {urls[-1].url}")
            known = known_exporters() if exporters is None else exporters
            urls[-1] = dataclasses.replace(urls[-1], exporter=check_exporter(_at(where, "exporter"), value, known))
        elif key in ("node", "class", "gpu_model"):
            fields[key] = value
        else:
            raise TargetError(where, f"unknown key {key!r} (node, class, gpu_model, url, exporter)")
    return _make(where, fields.get("node"), fields.get("class"), fields.get("gpu_model"), urls)


def expand_env(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace ``${VAR}`` by the environment's value; a missing variable is an error naming it. A value that
    begins a URL's host (after ``://`` or ``@``, not before ``@``: that is the user info) and is an IPv6 address
    (:func:`~app.listen.url_host`) is put in brackets: ``status.hostIP`` on an IPv6 cluster.

    >>> expand_env("url: http://${NODE_IP}:9100/metrics", {"NODE_IP": "fd00::7"})
    'url: http://[fd00::7]:9100/metrics'
    >>> expand_env("http://${CREDS}@${ADDR}/m", {"CREDS": "user:pass", "ADDR": "10.0.0.7:9100"})
    'http://user:pass@10.0.0.7:9100/m'
    """
    env = os.environ if environ is None else environ

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in env:
            raise TargetError(m.group(0), "environment variable is not set")
        value = env[m.group(1)]
        host = text.endswith(("://", "@"), 0, m.start()) and not text.startswith("@", m.end())
        return url_host(value) if host else value

    return _VAR.sub(sub, text)


def _endpoint(where: str, raw: Any, exporters: Collection[str]) -> Endpoint:
    if isinstance(raw, str):
        return Endpoint(_check_url(where, raw))
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
        raise TargetError(where, "must be a URL or a mapping with url (and exporter, optional)")
    _known(where, raw, _ENDPOINT_KEYS)
    exporter = raw.get("exporter")
    if exporter is not None:
        check_exporter(f"{where}.exporter", exporter, exporters)
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise TargetError(f"{where}.optional", f"must be true or false (got {optional!r})")
    return Endpoint(_check_url(f"{where}.url", raw["url"]), exporter, optional)


def _node(where: str, raw: Any, exporters: Collection[str]) -> Target:
    if not isinstance(raw, dict):
        raise TargetError(where, "must be a mapping with node and targets")
    _known(where, raw, _NODE_KEYS)
    eps = raw.get("targets", raw.get("urls"))
    if not isinstance(eps, list):
        raise TargetError(f"{where}.targets", "must be a list of URLs or {exporter, url, optional}")
    endpoints = [_endpoint(f"{where}.targets[{i}]", e, exporters) for i, e in enumerate(eps)]
    return _make(where, raw.get("node"), raw.get("class"), raw.get("gpu_model"), endpoints)


def load_targets(path: Path | str, environ: Mapping[str, str] | None = None,
                 exporters: Collection[str] | None = None) -> list[Target]:
    """Read a targets file (one node, or ``nodes: [...]``). ``exporters``: the names an endpoint's ``exporter``
    may take (default: the built-in mapping's)."""
    p = Path(path)
    known = known_exporters() if exporters is None else exporters
    try:
        doc = yaml.safe_load(expand_env(p.read_text(encoding="utf-8"), environ))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TargetError(str(p), f"cannot read targets: {read_error(exc)}") from None
    except TargetError as exc:  # a ${VAR} that is not set: which file asked for it
        raise TargetError(f"{p}: {exc.field}", exc.message) from None
    if isinstance(doc, dict) and "nodes" in doc:
        _known(str(p), doc, ("nodes",))
        if not isinstance(doc["nodes"], list) or not doc["nodes"]:
            raise TargetError(f"{p}: nodes", "must be a non-empty list")
        targets = [_node(f"{p}: nodes[{i}]", n, known) for i, n in enumerate(doc["nodes"])]
    else:
        targets = [_node(str(p), doc, known)]
    check_unique(targets)
    return targets


def check_unique(targets: Sequence[Target]) -> None:
    seen: set[str] = set()
    for t in targets:
        if t.node in seen:
            raise TargetError(t.node, "node listed twice")
        seen.add(t.node)
