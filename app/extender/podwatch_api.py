"""Reading our pods from the Kubernetes API: a paginated list and a watch stream, over aiohttp.

Access is in-cluster (``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's token and CA) or
through a URL such as ``kubectl proxy``'s ``http://127.0.0.1:8001`` with an optional bearer-token file.
The token file is re-read on every request, since projected service-account tokens rotate.

Requests (``/api/v1/pods``, every namespace)::

    list:  ?labelSelector=rttsched.io/app&fieldSelector=SELECTOR&limit=500[&continue=TOKEN]
    watch: ?labelSelector=...&fieldSelector=...&watch=true&resourceVersion=RV&allowWatchBookmarks=true
           &timeoutSeconds=N      -> newline-delimited WatchEvents {"type": ..., "object": ...}

``SELECTOR`` is ``spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed``: the pods bound to a node
and not finished, those kube-scheduler keeps on their node (:mod:`app.extender.podwatch_view` says which
count). A pod that finishes leaves the selection, which the watch reports as DELETED.

The API server closes a watch after its ``timeoutSeconds``, so a watch is read until the server closes it,
and no longer than ``timeoutSeconds`` plus the request timeout: a connection that is accepted but never
answered, or answered with headers and then nothing, fails as ``timeout`` instead of blocking.

Every failure is a :class:`KubeApiError` whose ``kind`` is short and stable (a metric label):
``timeout``, ``connect``, ``tls``, ``gone`` (410: the resource version or continue token expired, relist),
``http_<status>``, ``decode`` (not the JSON the API sends) and ``watch_error`` (an ERROR event). Its
``retry_after_s`` is the wait the server asked for: the ``Retry-After`` header (seconds) of a 429 or 5xx,
or an ERROR event's ``details.retryAfterSeconds``, capped at ``MAX_RETRY_AFTER_S``; None when it asked none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from app.errors import ConfigError, RttError
from app.listen import url_host
from app.scheduler.podinfo import APP_LABEL

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PODS_PATH = "/api/v1/pods"
BOUND_UNFINISHED_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
MAX_RETRY_AFTER_S = 60.0  # a longer Retry-After is waited for this long, then the backoff goes on
MAX_LINE_BYTES = 16 * 1024 * 1024  # one watch event; a pod object is a few KiB


class KubeApiError(RttError):
    """A list or watch request failed; ``kind`` classifies it (see the module docstring)."""

    def __init__(self, kind: str, detail: str = "", retry_after_s: float | None = None) -> None:
        self.kind = kind
        self.detail = detail
        self.retry_after_s = retry_after_s
        super().__init__(f"{kind}: {detail}" if detail else kind)


@dataclasses.dataclass(frozen=True)
class KubeAccess:
    """Where the API server is and how to authenticate to it."""

    base_url: str
    token_file: str = ""
    ca_file: str = ""

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str], root: Path = SERVICE_ACCOUNT) -> KubeAccess:
        """The API server a pod reaches through its service account; ConfigError outside a cluster."""
        host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
        port = environ.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
        if not host:
            raise ConfigError("RTT_PODS_API_URL", "not in a cluster (no KUBERNETES_SERVICE_HOST): "
                              "give the API URL, e.g. http://127.0.0.1:8001 for `kubectl proxy`")
        return cls(f"https://{url_host(host)}:{port}", str(root / "token"), str(root / "ca.crt"))

    @classmethod
    def from_url(cls, url: str, token_file: str = "", ca_file: str = "") -> KubeAccess:
        url = url.strip().rstrip("/")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - a port that is no number raises here, not at the first request
        except ValueError as exc:
            raise ConfigError("RTT_PODS_API_URL", f"not a URL: {exc} (got {url!r})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("RTT_PODS_API_URL", f"must be an http:// or https:// URL (got {url!r})")
        for name, path in (("RTT_PODS_TOKEN_FILE", token_file), ("RTT_PODS_CA_FILE", ca_file)):
            if path and not Path(path).is_file():
                raise ConfigError(name, f"no such file: {path}")
        return cls(url, token_file, ca_file)

    def headers(self) -> dict[str, str]:
        """Request headers, with the bearer token as the token file says now."""
        headers = {"Accept": "application/json"}
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise KubeApiError("token", f"cannot read {self.token_file}: {exc.strerror}") from None
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS settings for an https URL (the CA file if given, else the system's); None for http."""
        if not self.base_url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("RTT_PODS_CA_FILE", f"cannot load CA file {self.ca_file}: {exc}") from None


class PodsApi:
    """List and watch the pods carrying the app label (``rttsched.io/app``), in every namespace."""

    def __init__(self, session: aiohttp.ClientSession, access: KubeAccess, *, page_limit: int = 500,
                 request_timeout_s: float = 10.0, label_selector: str = APP_LABEL,
                 field_selector: str = BOUND_UNFINISHED_SELECTOR) -> None:
        self._session = session
        self._access = access
        self._ssl: ssl.SSLContext | bool = access.ssl_context() or True
        self._limit = page_limit
        self._timeout = request_timeout_s
        self._selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}

    async def list_pods(self) -> tuple[list[Any], str]:
        """Every matching pod (following ``continue`` pages) and the list's resourceVersion."""
        items: list[Any] = []
        token = ""
        while True:
            params = {**self._selectors, "limit": str(self._limit)}
            if token:
                params["continue"] = token
            async with self._get(params, aiohttp.ClientTimeout(total=self._timeout)) as resp:
                page = _decode(await resp.read())
            meta = page.get("metadata") or {}
            if not isinstance(page.get("items") or [], list) or not isinstance(meta, dict):
                raise KubeApiError("decode", "not a PodList")
            items.extend(page.get("items") or [])
            token = str(meta.get("continue") or "")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(self, resource_version: str, timeout_s: float) -> AsyncGenerator[list[dict[str, Any]], None]:
        """WatchEvents after ``resource_version``, in the batches they arrive in, until the server closes the watch.

        The server is asked to close it after ``timeout_s`` rounded up to whole seconds (``timeoutSeconds``), and
        the stream is read until it does: ending normally means the server closed it, every change up to then
        sent. The first batch is empty: it says the server accepted the watch, nothing about the pods. A watch
        the server has not closed ``request_timeout_s`` after its ``timeoutSeconds`` is hung (it stopped
        sending and never closes, or never answered) and raises KubeApiError ``timeout``; an ERROR event raises
        (``gone`` for 410). Close it with ``contextlib.aclosing`` when leaving early.
        """
        seconds = max(1, math.ceil(timeout_s))
        params = {**self._selectors, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)}
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = aiohttp.ClientTimeout(total=seconds + self._timeout, sock_connect=self._timeout)
        async with self._get(params, timeout) as resp:
            yield []  # connected: the server accepted the watch
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                if b"\n" not in buffer:
                    if len(buffer) > MAX_LINE_BYTES:
                        raise KubeApiError("decode", "watch event longer than 16 MiB")
                    continue
                *lines, buffer = buffer.split(b"\n")
                events = [_event(line) for line in lines if line.strip()]
                if events:
                    yield events
            if buffer.strip():
                yield [_event(buffer)]

    @contextlib.asynccontextmanager
    async def _get(self, params: dict[str, str], timeout: aiohttp.ClientTimeout) -> AsyncIterator[Any]:
        """GET the pods with ``params``: a 200 response, else KubeApiError. One retry on 401 (token rotated).

        Transport failures while the caller reads the body are mapped to KubeApiError too.
        """
        url = self._access.base_url + PODS_PATH
        try:
            for attempt in (1, 2):
                async with self._session.get(url, params=params, headers=self._access.headers(), ssl=self._ssl,
                                             timeout=timeout) as resp:
                    if resp.status == 401 and attempt == 1:
                        continue
                    if resp.status == 410:
                        raise KubeApiError("gone", "resource version or continue token expired")
                    if resp.status != 200:
                        text = (await resp.content.read(300)).decode("utf-8", "replace")
                        wait = retry_after(resp.headers.get("Retry-After")) if _may_retry(resp.status) else None
                        raise KubeApiError(f"http_{resp.status}", text.strip(), wait)
                    yield resp
                    return
        except TimeoutError:
            detail = f"no complete answer from {self._access.base_url} within {timeout.total:g}s"
            raise KubeApiError("timeout", detail) from None
        except aiohttp.ClientSSLError as exc:
            raise KubeApiError("tls", str(exc)) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise KubeApiError("connect", str(exc) or type(exc).__name__) from None


def _may_retry(status: int) -> bool:
    """Whether a ``Retry-After`` on this status asks for a later retry (429 Too Many Requests, 5xx)."""
    return status == 429 or 500 <= status <= 599


def retry_after(value: Any) -> float | None:
    """The wait a ``Retry-After`` header or a Status's ``retryAfterSeconds`` asks for, capped; None if none.

    Only the delay-seconds form is read (the API server sends no HTTP dates).

    >>> retry_after("5"), retry_after(3600), retry_after("Wed, 21 Oct 2026 07:28:00 GMT"), retry_after(None)
    (5.0, 60.0, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = int(value.strip())
    else:
        return None
    return min(float(seconds), MAX_RETRY_AFTER_S)


def _decode(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise KubeApiError("decode", str(exc)) from None
    if not isinstance(doc, dict):
        raise KubeApiError("decode", f"expected an object, got {type(doc).__name__}")
    return doc


def _event(line: bytes) -> dict[str, Any]:
    event = _decode(line)
    kind, obj = event.get("type"), event.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise KubeApiError("decode", "not a WatchEvent")
    if kind == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise KubeApiError("gone", str(obj.get("message", "")))
        details = obj.get("details")
        wait = retry_after(details.get("retryAfterSeconds")) if isinstance(details, dict) else None
        raise KubeApiError("watch_error", f"{code}: {obj.get('message', '')}", wait)
    return event
