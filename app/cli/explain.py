"""``rttsched explain``: ask a running extender why it scores each candidate node as it does.

The request is the body of ``/prioritize`` (a pod and its candidates), sent to the extender's ``POST /explain``;
the answer is printed as a table within 100 columns, or as the extender's JSON (``--json``). Give the body
as a file (``--args``, ``-`` for stdin), a v1 Pod file (``--pod``) with ``--nodes``, or just ``--app`` (with
``--input-mb``) and ``--nodes``.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HELP = "explain the extender's scores for a pod: prediction, what moved it, correction, penalties, score"
WIDTH = 100
COLUMNS = (("node", "node", 16, "<"), ("hardware", "hardware", 14, "<"), ("score", "score", 5, ">"),
           ("model_rtt_ms", "model ms", 10, ">"), ("correction", "corr.", 7, ">"), ("penalty", "assumed", 9, ">"),
           ("rtt_ms", "scored ms", 11, ">"), ("credibility", "cred.", 7, ">"), ("learnt", "learnt", 8, ">"),
           ("explored", "explore", 9, ">"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="the extender's URL (default http://127.0.0.1:RTT_EXTENDER_PORT)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--args", help="an ExtenderArgs JSON file, the body of /prioritize ('-': stdin)")
    src.add_argument("--pod", help="a v1 Pod JSON file (candidates from --nodes)")
    src.add_argument("--app", help="the pod's app label (a pod is made up; candidates from --nodes)")
    p.add_argument("--nodes", help="comma-separated candidate node names (with --pod or --app)")
    p.add_argument("--input-mb", type=float, default=None, help="the pod's input size in MB (with --app)")
    p.add_argument("--top", type=int, default=3, help="features listed per node (1..50, default 3)")
    p.add_argument("--exact", action="store_true", help="exact TreeSHAP instead of XGBoost's approx_contribs")
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


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ExtenderArgs to send, from ``--args``, ``--pod`` or ``--app`` (with ``--nodes``), plus the options."""
    from app.errors import ConfigError

    if not 1 <= args.top <= 50:
        raise ConfigError("--top", f"must be in 1..50 (got {args.top})")
    if not args.timeout > 0:  # urlopen: a negative one raises ValueError, 0 makes the socket non-blocking
        raise ConfigError("--timeout", f"must be > 0 (got {args.timeout:g})")
    if not math.isfinite(args.timeout):
        raise ConfigError("--timeout", f"must be a finite number of seconds (got {args.timeout:g})")
    if args.args:
        body = _read_json(args.args, "--args")
        if not isinstance(body, dict):
            raise ConfigError("--args", "must hold a JSON object (ExtenderArgs: Pod and NodeNames or Nodes)")
    else:
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
            from app.scheduler.podinfo import APP_PATTERN, MAX_APP_LEN

            if not args.app or len(args.app) > MAX_APP_LEN or not APP_PATTERN.fullmatch(args.app):
                raise ConfigError("--app", f"not an app label value: letters, digits, '.', '_' and '-', at most "
                                           f"{MAX_APP_LEN} (got {args.app!r})")
            annotations = {} if args.input_mb is None else {"rttsched.io/input-size-mb": f"{args.input_mb:g}"}
            pod = {"metadata": {"name": f"explain-{args.app.lower()}", "namespace": "default", "uid": "",
                                "labels": {"rttsched.io/app": args.app}, "annotations": annotations}}
        body = {"Pod": pod, "NodeNames": nodes}
    return {**body, "Explain": {"top": args.top, "contributions": "exact" if args.exact else "approx"}}


def post(url: str, body: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST ``body`` to ``url/explain``; one-line errors (:class:`RttError`) when that fails."""
    import http.client
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    import orjson

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
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - http(s) only, checked above
            return dict(orjson.loads(resp.read()))
    except http.client.InvalidURL as exc:  # what urlsplit lets through (a control character ...)
        raise ConfigError("--url", f"not a URL: {exc} (got {url!r})") from None
    except urllib.error.HTTPError as exc:
        try:
            detail = orjson.loads(exc.read()).get("Error") or exc.reason
        except (orjson.JSONDecodeError, AttributeError):
            detail = exc.reason
        raise RttError(f"the extender at {url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RttError(f"cannot reach the extender at {url}: {reason} (is `rttsched extender` running? --url)") \
            from None


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
    moved = ", ".join(f"{c['feature']}={'-' if c['value'] is None else format(c['value'], 'g')} "
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


def format_answer(answer: Mapping[str, Any]) -> list[str]:
    """The answer as lines within 100 columns: a head, one row per candidate, its reasons indented below."""
    head = textwrap.TextWrapper(width=WIDTH, subsequent_indent="  ")
    lines = head.wrap(f"{_pod_title(answer.get('pod') or {})}: {len(answer['nodes'])} candidates, contributions"
                      f" {answer.get('contributions_method')} (XGBoost, margin scale)")
    if answer.get("neutral"):
        lines += head.wrap(f"neutral answer ({answer['neutral']}): every node passes with score 5")
    else:
        lines += head.wrap(f"best: {answer.get('best')}"
                           + (f" (exploring: {answer['explored']})" if answer.get("explored") else "")
                           + (" — SLA relaxed: all over it" if answer.get("sla_relaxed") else ""))
    lines.append("".join(f"{title:{align}{width}}" for _, title, width, align in COLUMNS))
    wrap = textwrap.TextWrapper(width=WIDTH, initial_indent="    ", subsequent_indent="      ")
    for n in answer["nodes"]:
        lines.append("".join(f"{_cell(n, key)[:width - 1]:{align}{width}}" for key, _, width, align in COLUMNS))
        if answer.get("neutral"):
            continue
        if n.get("failed"):
            lines += wrap.wrap(f"filtered out: {n['failed']}")
        if n.get("assumed_pods"):
            lines += wrap.wrap(f"assumed pods not yet in its metrics: {', '.join(n['assumed_pods'])}")
        lines += wrap.wrap(f"moved by: {_why(n)}")
    return lines  # wrapped (long words broken), the table's columns add up to 96: every line fits in WIDTH


def run(args: argparse.Namespace, settings: Any) -> int:
    import orjson

    url = args.url or f"http://127.0.0.1:{settings.extender_port}"
    answer = post(url, request_body(args), args.timeout)
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(format_answer(answer)))
    return 0

