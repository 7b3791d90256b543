"""Secrets stay out of logs: URLs printed without their password, every log line scrubbed of known secrets.

:func:`mask_url` is for what a process prints about its connections; :func:`install` adds a
:class:`SecretFilter` to every handler of the root logger, which replaces each known secret (the
password in ``REDIS_URL``, the contents of ``RTT_REDIS_PASSWORD_FILE`` and ``RTT_KAFKA_SASL_PASSWORD_FILE``)
and the password part of any ``scheme://user:password@host`` URL with ``***`` — in the message, its
arguments and a formatted traceback alike.

>>> mask_url("redis://:hunter2@redis:6379/0")
'redis://:***@redis:6379/0'
>>> mask_url("redis://redis:6379/0")
'redis://redis:6379/0'
>>> with_password("redis://redis:6379/0", "p@ss")
'redis://:p%40ss@redis:6379/0'
>>> url_password("redis://app:p%40ss@redis:6379/0")
'p@ss'
>>> SecretFilter(["hunter2"]).scrub("auth hunter2 failed for rediss://u:x@h:1")
'auth *** failed for rediss://u:***@h:1'
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote, urlsplit, urlunsplit

MASK = "***"
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s/]+)(?P<at>@)")


def url_password(url: str) -> str:
    """The (decoded) password of a URL, '' when it has none."""
    if not url:
        return ""
    try:
        return unquote(urlsplit(url).password or "")
    except ValueError:
        return ""


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for printing)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}{m['at']}", url)


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` set (user kept; the password URL-quoted)."""
    parts = urlsplit(url)
    user = quote(unquote(parts.username or ""), safe="")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:{quote(password, safe='')}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class SecretFilter(logging.Filter):
    """Replaces known secrets and URL passwords in every record that passes (never drops one)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
            quoted = quote(secret, safe="")
            if quoted != secret and quoted in text:
                text = text.replace(quoted, MASK)
        return mask_url(text)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        record.msg, record.args = self.scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self.scrub(record.stack_info)
        return True


def install(secrets: Iterable[str], logger: logging.Logger | None = None) -> SecretFilter:
    """Give every handler of ``logger`` (the root logger by default) one :class:`SecretFilter` of ``secrets``.

    Called again (``main()`` run twice in one process), it does not stack a second filter on a handler: the
    filter it finds there is replaced by one that masks the secrets of both calls, so none is forgotten.
    """
    target = logger or logging.getLogger()
    known = set(secrets)
    for handler in target.handlers:
        known.update(s for f in handler.filters if isinstance(f, SecretFilter) for s in f.secrets)
    flt = SecretFilter(known)
    for handler in target.handlers:
        for old in [f for f in handler.filters if isinstance(f, SecretFilter)]:
            handler.removeFilter(old)
        handler.addFilter(flt)
    return flt
