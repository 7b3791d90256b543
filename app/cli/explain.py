"""``rttsched explain``: ask a running extender why it scores each candidate node as it does.

The request is the body of ``/prioritize`` (a pod and its candidates), sent to the extender's ``POST /explain``;
the answer is printed as a table within 100 columns, or as the extender's JSON (``--json``). Give the body
as a file (``--args``, ``-`` for stdin; an ``Explain`` object in it is sent as it is), a v1 Pod file (``--pod``)
with ``--nodes``, or just ``--app`` (with ``--input-mb``) and ``--nodes``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import ssl
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HELP = "explain the extender's scores for a pod: prediction, what moved it, correction, penalties, score"
WIDTH = 100
DEFAULT_TOP = 3
# (answer field, title, aligned right): each column as wide as its widest cell, two spaces apart
COLUMNS = (("node", "node", False), ("hardware", "hardware", False), ("score", "score", True),
           ("model_rtt_ms", "model ms", True), ("correction", "corr.", True), ("penalty", "assumed", True),
           ("rtt_ms", "scored ms", True), ("credibility", "cred.", True), ("learnt", "learnt", True),
           ("explored", "explore", True))
INDENT = "  "  # the rest of a row under a node name too long to share a line with it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="the extender's URL (default http://127.0.0.1:RTT_EXTENDER_PORT, https:// when "
                        "RTT_EXTENDER_TLS_CERT is set: run it beside the extender, in its pod)")
    p.add_argument("--ca-file", default=None, metavar="PATH",
                   help="CA certificates (PEM) to verify an https:// extender's certificate and host name against "
                        "(default: the system's; for the default URL, the certificate of RTT_EXTENDER_TLS_CERT)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--args", help="an ExtenderArgs JSON file, the body of /prioritize ('-': stdin)")
    src.add_argument("--pod", help="a v1 Pod JSON file (candidates from --nodes)")
    src.add_argument("--app", help="the pod's app label (a pod is made up; candidates from --nodes)")
    p.add_argument("--nodes", help="comma-separated candidate node names (with --pod or --app)")
    p.add_argument("--input-mb", type=float, default=None, help="the pod's input size in MB (with --app)")
    p.add_argument("--top", type=int, default=None,
                   help=f"features listed per node (1..50, default {DEFAULT_TOP}; not with an --args body's Explain)")
    p.add_argument("--exact", action="store_true",
                   help="exact TreeSHAP instead of XGBoost's approx_contribs (not with an --args body's Explain)")
    p.add_argument("--json", action="store_true", help="print the extender's JSON answer")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)")


def _read_json(path: str, flag: str) -> Any:
    import orjson

    from app.errors import ConfigError

    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        return orjson.loads(raw)
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(flag, f"{path} is not JSON: {exc}") from None


def _input_size(value: float) -> str:
    """``--input-mb`` as the annotation's text, read back by the extender as the very same number; a value it
    would take for no size (negative, not finite, beyond the models' float32 rows) is the flag's error.

    >>> _input_size(512.0), _input_size(1234567.5), _input_size(0.1)
    ('512', '1234567.5', '0.1')
    """
    from app.errors import ConfigError
    from app.scheduler.podinfo import FLOAT32_MAX

    if not value >= 0:
        raise ConfigError("--input-mb", f"must be a size in MB >= 0 (got {value:g})")
    if not value <= FLOAT32_MAX:
        raise ConfigError("--input-mb", f"must be a size in MB >= 0 and at most {FLOAT32_MAX!r}, the largest "
                                        f"the models take (got {value!r})")
    return repr(value).removesuffix(".0")


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ExtenderArgs to send, from ``--args``, ``--pod`` or ``--app`` (with ``--nodes``), plus the options.

    An ``Explain`` object in the ``--args`` body is sent as it is (the extender checks it); ``--top`` or
    ``--exact`` beside it is refused, not one of them silently dropped.
    """
    from app.errors import ConfigError

    if args.top is not None and not 1 <= args.top <= 50:
        raise ConfigError("--top", f"must be in 1..50 (got {args.top})")
    if not args.timeout > 0:  # urlopen: a negative one raises ValueError, 0 makes the socket non-blocking
        raise ConfigError("--timeout", f"must be > 0 (got {args.timeout:g})")
    if not math.isfinite(args.timeout):
        raise ConfigError("--timeout", f"must be a finite number of seconds (got {args.timeout:g})")
    if args.input_mb is not None and not args.app:
        raise ConfigError("--input-mb", "only with --app (the pod of --pod or --args brings its own "
                                        "rttsched.io/input-size-mb annotation)")
    if args.nodes is not None and args.args:
        raise ConfigError("--nodes", "only with --pod or --app (the --args body names its candidates)")
    options = {"top": DEFAULT_TOP if args.top is None else args.top,
               "contributions": "exact" if args.exact else "approx"}
    if args.args:
        body = _read_json(args.args, "--args")
        if not isinstance(body, dict):
            raise ConfigError("--args", "must hold a JSON object (ExtenderArgs: Pod and NodeNames or Nodes)")
        if body.get("Explain") is not None:
            given = [f for f, on in (("--top", args.top is not None), ("--exact", args.exact)) if on]
            if given:
                raise ConfigError("--args", f"its body has an Explain object of its own: give it or "
                                            f"{' and '.join(given)}, not both")
            return body
        return {**body, "Explain": options}
    nodes = [n.strip() for n in (args.nodes or "").split(",") if n.strip()]
    if not nodes:
        raise ConfigError("--nodes", "name at least one candidate node")
    if args.pod:
        pod = _read_json(args.pod, "--pod")
        if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod" or "items" in pod \
                or not isinstance(pod.get("metadata"), dict):
            if not isinstance(pod, dict):
                got = type(pod).__name__
            elif pod.get("kind", "Pod") != "Pod":
                got = f"kind {pod['kind']}" if isinstance(pod["kind"], str) else f"kind {pod['kind']!r}"
            else:
                got = "a list of items" if "items" in pod else "an object without metadata"
            raise ConfigError("--pod", f"must hold a v1 Pod with metadata (got {got})")
    else:
        from app.scheduler.podinfo import APP_PATTERN, INPUT_SIZE_ANNOTATION, MAX_APP_LEN

        if not args.app or len(args.app) > MAX_APP_LEN or not APP_PATTERN.fullmatch(args.app):
            raise ConfigError("--app", f"not an app label value: letters, digits, '.', '_' and '-', at most "
                                       f"{MAX_APP_LEN} (got {args.app!r})")
        annotations = {} if args.input_mb is None else {INPUT_SIZE_ANNOTATION: _input_size(args.input_mb)}
        pod = {"metadata": {"name": f"explain-{args.app.lower()}", "namespace": "default", "uid": "",
                            "labels": {"rttsched.io/app": args.app}, "annotations": annotations}}
    return {"Pod": pod, "NodeNames": nodes, "Explain": options}


_NUMBER, _TEXT, _FLAG, _LIST = ((int, float), "a number"), ((str,), "a string"), ((bool,), "a boolean"), \
    ((list,), "an array")
# what format_answer reads of a node, and the JSON types it can show (each of them may be null or missing)
_NODE_FIELDS = {"hardware": _TEXT, "model_rtt_ms": _NUMBER, "correction": _NUMBER, "penalty": _NUMBER,
                "rtt_ms": _NUMBER, "credibility": _NUMBER, "learnt": _FLAG, "explored": _FLAG, "failed": _TEXT,
                "source": _TEXT, "contributions_error": _TEXT, "assumed_pods": _LIST, "contributions": _LIST}
_MOVED_FIELDS = {"bias": _NUMBER, "margin": _NUMBER, "model_rtt_ms": _NUMBER, "model_key": _TEXT,
                 "model_version": _NUMBER}  # what "moved by" reads beside the contributions


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """isinstance, a JSON true or false counting as no number."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def _not_explanation(answer: Any) -> str | None:
    """Why ``answer`` is no ``/explain`` answer that :func:`format_answer` can show (the extender's OpenAPI
    ``Explanation``, and the types of what the table reads), None when it is one.

    >>> _not_explanation([1]), _not_explanation({"nodes": {}})
    ('a JSON array, not an object', "'nodes' is not an array")
    """
    if not isinstance(answer, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(answer), "number")
        return f"a JSON {kind}, not an object"
    if "nodes" not in answer:
        return "no 'nodes'"
    if not isinstance(answer["nodes"], list):
        return "'nodes' is not an array"
    for key in ("pod", "neutral", "best"):
        if key not in answer:
            return f"no {key!r}"
    if not isinstance(answer["pod"], dict):
        return "'pod' is not an object"
    for key in ("neutral", "best", "explored", "contributions_method"):
        if answer.get(key) is not None and not isinstance(answer[key], str):
            return f"{key!r} is not a string"
    for i, n in enumerate(answer["nodes"]):
        if not isinstance(n, dict):
            return f"nodes[{i}] is not an object"
        if not isinstance(n.get("node"), str):
            return f"nodes[{i}] has no 'node'" if n.get("node") is None else f"nodes[{i}].node is not a string"
        if not _is(n.get("score"), (int,)):
            return f"nodes[{i}] has no 'score'" if n.get("score") is None else f"nodes[{i}].score is not an integer"
        for key, (types, what) in _NODE_FIELDS.items():
            if n.get(key) is not None and not _is(n[key], types):
                return f"nodes[{i}].{key} is not {what}"
        if not all(isinstance(p, str) for p in n.get("assumed_pods") or ()):
            return f"nodes[{i}].assumed_pods is not a list of app names"
        for j, c in enumerate(n.get("contributions") or ()):
            if not isinstance(c, dict) or not isinstance(c.get("feature"), str) \
                    or not _is(c.get("contribution"), _NUMBER[0]) \
                    or (c.get("value") is not None and not _is(c["value"], _NUMBER[0])):
                return f"nodes[{i}].contributions[{j}] is not a feature's value and contribution"
        if n.get("contributions"):
            for key, (types, what) in _MOVED_FIELDS.items():
                if not _is(n.get(key), types):
                    return f"nodes[{i}] has contributions but its {key} is not {what}"
    return None


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)


def _read_file(path: str, field: str) -> bytes:
    from app.errors import ConfigError

    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None


def _ca_context(path: str) -> ssl.SSLContext:
    """A client context that trusts the CA certificates of ``path`` (``--ca-file``) and checks the host name."""
    from app.errors import ConfigError

    certs = _PEM_CERT.findall(_read_file(path, "--ca-file"))
    if not certs:
        raise ConfigError("--ca-file", f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:  # these CAs only, not the system's beside them
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=b"\n".join(certs).decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise ConfigError("--ca-file", f"{path} holds no certificate that can be read: {_ssl_reason(exc)}") from None


def _own_certificate_context(path: str) -> ssl.SSLContext:
    """A client context for the local extender that serves the certificate of ``path`` (``RTT_EXTENDER_TLS_CERT``,
    the one beside ``rttsched explain`` in the extender's pod): that certificate, and no other, is trusted (its
    issuer need not be known, nor its names include 127.0.0.1)."""
    from app.errors import ConfigError

    certs = _PEM_CERT.findall(_read_file(path, "RTT_EXTENDER_TLS_CERT"))
    if not certs:
        raise ConfigError("RTT_EXTENDER_TLS_CERT", f"{path} holds no PEM certificate")
    try:  # the server's own certificate, and not the system's CAs: pinned
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=certs[0].decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise ConfigError("RTT_EXTENDER_TLS_CERT", f"cannot read the certificate of {path}: {_ssl_reason(exc)}"
                          ) from None
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # trusted as it is, whoever issued it
    ctx.check_hostname = False  # 127.0.0.1, which its names need not hold: the certificate itself is what is checked
    return ctx


def endpoint(args: argparse.Namespace, settings: Any) -> tuple[str, ssl.SSLContext | None, str | None]:
    """The URL to ask, the TLS context to verify it with (None: plain HTTP, or the system's CAs) and what that
    context trusts, for an error (``--ca-file PATH``, ``RTT_EXTENDER_TLS_CERT PATH``; None: the system's CAs).

    No ``--url``: the extender on this machine, ``https://`` when ``RTT_EXTENDER_TLS_CERT`` is set (the extender's
    own settings, as in its pod), verified against ``--ca-file`` or else that very certificate. ``--ca-file`` is
    only for an ``https://`` URL."""
    from app.errors import ConfigError

    tls = bool(settings.extender_tls_cert)
    url = args.url or f"{'https' if tls else 'http'}://127.0.0.1:{settings.extender_port}"
    if args.ca_file is not None and not url.lower().startswith("https://"):
        said = "--url is" if args.url else "RTT_EXTENDER_TLS_CERT is not set: the default URL is"
        raise ConfigError("--ca-file", f"only for an https:// extender ({said} {url})")
    if args.ca_file is not None:
        return url, _ca_context(args.ca_file), f"--ca-file {args.ca_file}"
    if args.url is None and tls:
        cert = settings.extender_tls_cert
        return url, _own_certificate_context(cert), f"RTT_EXTENDER_TLS_CERT {cert}"
    return url, None, None


def _ssl_reason(exc: BaseException) -> str:
    """An ``ssl`` error in a few words: the verification's message, or the library's reason without its
    ``[SSL: ...]`` code and ``(_ssl.c:NNN)`` place.

    >>> _ssl_reason(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"))
    'wrong version number'
    """
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return str(exc.verify_message).rstrip(".")
    text = str(exc.args[1] if isinstance(exc, ssl.SSLError) and len(exc.args) > 1 else exc)
    return re.sub(r"^\[[A-Z0-9_]+: [A-Z0-9_]+\] | \(_ssl\.c:\d+\)$", "", text).strip() or text


def _unreached(url: str, reason: Any, verified_by: str | None) -> str:
    """What the line says when ``url`` gave no answer for ``reason`` (``verified_by``: what the certificate was
    checked against, :func:`endpoint`)."""
    if isinstance(reason, ssl.SSLCertVerificationError):
        if "mismatch" in (reason.verify_message or "").lower():  # "Hostname mismatch", "IP address mismatch"
            fix = "give --url a name its certificate holds"
        elif verified_by is None:
            fix = "give the CA that issued it with --ca-file"
        elif verified_by.startswith("--ca-file"):
            fix = f"no CA of {verified_by} issued it"
        else:  # the default URL, pinned to the certificate the extender's settings name
            fix = f"it is not the certificate of {verified_by}: is another server on the port? --url, --ca-file"
        return f"cannot verify the certificate of the extender at {url}: {_ssl_reason(reason)} ({fix})"
    if isinstance(reason, ssl.SSLError):
        return (f"no TLS with the extender at {url}: {_ssl_reason(reason)} (does it serve HTTPS? an extender "
                f"without RTT_EXTENDER_TLS_CERT serves http://)")
    if url.lower().startswith("http://") and isinstance(reason, ConnectionResetError):  # RemoteDisconnected too
        return (f"cannot reach the extender at {url}: {reason} (one that serves HTTPS, with RTT_EXTENDER_TLS_CERT, "
                f"closes plain HTTP: --url https://...)")
    return f"cannot reach the extender at {url}: {reason} (is `rttsched extender` running? --url)"


def post(url: str, body: Mapping[str, Any], timeout_s: float, context: ssl.SSLContext | None = None,
         verified_by: str | None = None) -> dict[str, Any]:
    """POST ``body`` to ``url/explain`` (an https URL verified with ``context``, None: the system's CAs; ``verified_by``
    says what ``context`` trusts, for errors); one-line errors (:class:`RttError`) when that fails."""
    import http.client
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    import orjson

    from app.cli.output import printable
    from app.errors import ConfigError, RttError

    try:  # parsed once, here: a bad [IPv6] address or port is the flag's error, not urllib's traceback
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number or out of range
    except ValueError as exc:
        raise ConfigError("--url", f"not a URL: {exc} (got {url!r})") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError("--url", f"must start with http:// or https:// (got {url!r})")
    if not parts.hostname:
        raise ConfigError("--url", f"names no host (got {url!r})")
    req = urllib.request.Request(url.rstrip("/") + "/explain", data=orjson.dumps(body), method="POST",  # noqa: S310
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:  # noqa: S310 - http(s) only
            raw = resp.read()
    except http.client.InvalidURL as exc:  # what urlsplit lets through (a control character ...)
        raise ConfigError("--url", f"not a URL: {exc} (got {url!r})") from None
    except urllib.error.HTTPError as exc:
        try:
            detail = orjson.loads(exc.read()).get("Error") or exc.reason
        except (orjson.JSONDecodeError, AttributeError):
            detail = exc.reason
        raise RttError(f"the extender at {url} answered {exc.code}: {printable(str(detail))}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RttError(_unreached(url, getattr(exc, "reason", exc), verified_by)) from None
    why: str | None = "not JSON"
    with contextlib.suppress(orjson.JSONDecodeError):
        answer = orjson.loads(raw)
        why = _not_explanation(answer)
    if why is not None:  # another service at --url: an HTML page, some other JSON
        raise RttError(f"the answer from {url} is not an /explain answer ({why})")
    return answer


def _cell(n: Mapping[str, Any], key: str) -> str:
    v = n.get(key)
    if isinstance(v, bool):
        return "yes" if v else "no" if key == "learnt" else ""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if key in ("correction", "penalty", "credibility") else f"{v:.1f}"
    return str(v)


def _why(n: Mapping[str, Any]) -> str:
    contribs = n.get("contributions")
    if not contribs:
        return n.get("contributions_error") or ("node-weights' own prediction" if n.get("source") == "node-weights"
                                                else "no prediction")
    moved = ", ".join(f"{c['feature']}={'-' if c.get('value') is None else format(c['value'], 'g')} "
                      f"{c['contribution']:+.3f}" for c in contribs)
    scale = f"exp(margin {n['margin']:.3f})" if n.get("link") == "log" else f"margin {n['margin']:.3f}"
    return f"{moved}; bias {n['bias']:+.3f}; {scale} = {n['model_rtt_ms']} ms ({n['model_key']} v{n['model_version']})"


def _pod_title(pod: Mapping[str, Any]) -> str:
    """``app pod namespace/name``, leaving out what the pod does not have.

    >>> _pod_title({"app": "gCTF", "namespace": "em", "name": "ctf-1"}), _pod_title({"name": "x", "app": None})
    ('gCTF pod em/ctf-1', 'pod x (no app label)')
    """
    where = "/".join(str(p) for p in (pod.get("namespace"), pod.get("name")) if p) or "(unnamed)"
    app = pod.get("app")
    return f"{app} pod {where}" if app else f"pod {where} (no app label)"


def _cut(text: str, width: int) -> str:
    """``text`` within ``width``, its middle replaced by ``…`` when it is longer: both ends stay, where names of
    hardware differ (``NVIDIA A100-SXM4-80GB``, ``-40GB``).

    >>> _cut("NVIDIA A100-SXM4-80GB", 12), _cut("RTX 4090", 12)
    ('NVIDIA…-80GB', 'RTX 4090')
    """
    if len(text) <= width:
        return text
    keep = max(width - 1, 2)
    return f"{text[:(keep + 1) // 2]}…{text[len(text) - keep // 2:]}"


def _table(nodes: list[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The head's lines and, per node, its row's lines: columns as wide as their widest cell, every node named
    in full. A row too wide for :data:`WIDTH` (cloud node names run to 40 characters and more) puts the node's
    name on a line of its own, the rest of the row indented below it; hardware still too wide is cut in the
    middle, marked ``…``."""
    from app.cli.output import printable, table

    titles = [title for _, title, _ in COLUMNS]
    right = frozenset(i for i, (_, _, r) in enumerate(COLUMNS) if r)
    cells = [[printable(_cell(n, key)) for key, _, _ in COLUMNS] for n in nodes]
    lines = table(titles, cells, right)
    if max(map(len, lines)) <= WIDTH:
        return lines[:1], [[line] for line in lines[1:]]
    rest = [c[1:] for c in cells]
    right = frozenset(i - 1 for i in right)
    lines = table(titles[1:], rest, right)
    over = max(map(len, lines)) + len(INDENT) - WIDTH
    if over > 0:  # the hardware column gives way, down to its title's width
        hw = max(len(titles[1]), max(len(c[0]) for c in rest) - over)
        lines = table(titles[1:], [[_cut(c[0], hw), *c[1:]] for c in rest], right)
    names = [textwrap.wrap(c[0], WIDTH, break_on_hyphens=False) or [c[0]] for c in cells]
    return [titles[0], INDENT + lines[0]], [[*name, INDENT + line] for name, line in zip(names, lines[1:], strict=True)]


def format_answer(answer: Mapping[str, Any]) -> list[str]:
    """The answer (:func:`_not_explanation` says it is one) as lines within 100 columns: a head, one row per
    candidate, its reasons indented below. What the answer names is escaped where it cannot be printed."""
    from app.cli.output import printable

    head = textwrap.TextWrapper(width=WIDTH, subsequent_indent="  ")
    lines = head.wrap(printable(f"{_pod_title(answer.get('pod') or {})}: {len(answer['nodes'])} candidates, "
                                f"contributions {answer.get('contributions_method')} (XGBoost, margin scale)"))
    if answer.get("neutral"):
        lines += head.wrap(printable(f"neutral answer ({answer['neutral']}): every node passes with score 5"))
    else:
        lines += head.wrap(printable(f"best: {answer.get('best')}"
                                     + (f" (exploring: {answer['explored']})" if answer.get("explored") else "")
                                     + (" — SLA relaxed: all over it" if answer.get("sla_relaxed") else "")))
    titles, rows = _table(list(answer["nodes"]))
    lines += titles
    wrap = textwrap.TextWrapper(width=WIDTH, initial_indent="    ", subsequent_indent="      ")
    for n, row in zip(answer["nodes"], rows, strict=True):
        lines += row
        if answer.get("neutral"):
            continue
        if n.get("failed"):
            lines += wrap.wrap(printable(f"filtered out: {n['failed']}"))
        if n.get("assumed_pods"):
            lines += wrap.wrap(printable(f"assumed pods not yet in its metrics: {', '.join(n['assumed_pods'])}"))
        lines += wrap.wrap(printable(f"moved by: {_why(n)}"))
    return lines


def run(args: argparse.Namespace, settings: Any) -> int:
    import orjson

    url, context, verified_by = endpoint(args, settings)
    answer = post(url, request_body(args), args.timeout, context, verified_by)
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(format_answer(answer)))
    return 0

