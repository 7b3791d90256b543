"""A dead-letters value for a consumed message that failed its contract (``topics/dead-letters.json``): the
worker's intakes and the trainer build theirs here."""

from __future__ import annotations

import base64
from typing import Any

from app.errors import ContractError

MAX_RAW_BYTES = 65_536  # raw payload kept in a dead letter (base64 of the first bytes)
MAX_KEY_CHARS = 256  # key kept in a dead letter: its first characters (a node name has at most 253)
MAX_ERROR_CHARS = 2_000


def _text(b: Any) -> str | None:
    if b is None:
        return None
    return b.decode("utf-8", "replace") if isinstance(b, bytes | bytearray) else str(b)


def _utf8(text: str) -> str:
    """``text``, each lone surrogate (which UTF-8 cannot encode) written as its escape (``\\udXXX``).

    >>> _utf8("gpu-\\ud800"), _utf8("n1")
    ('gpu-\\\\ud800', 'n1')
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _key(key: bytes | bytearray | str | None) -> tuple[str | None, str]:
    """``key`` as text of at most :data:`MAX_KEY_CHARS` characters, and what was cut (empty when nothing was).

    Each byte that is not UTF-8 becomes one replacement character (three bytes), so only the first bytes are
    decoded: a 1 MB key makes at most 1 KiB here, not 3 MB. A lone surrogate in a key given as a ``str`` is
    kept as its escape (six characters), so the dead letter can be encoded: at most 1.5 KiB.

    >>> _key(b"\\xff" * 1000)[0] == "\\ufffd" * MAX_KEY_CHARS, _key(b"\\xff" * 1000)[1]
    (True, 'key cut to its first 256 characters (of 1,000 bytes)')
    >>> _key("n1"), _key(None), _key("k\\ud800")
    (('n1', ''), (None, ''), ('k\\\\ud800', ''))
    """
    if key is None:
        return None, ""
    if isinstance(key, bytes | bytearray):
        head = bytes(key[:4 * MAX_KEY_CHARS])  # the first MAX_KEY_CHARS characters lie within these bytes
        text, size = head.decode("utf-8", "replace"), f"{len(key):,} bytes"
        cut = len(text) > MAX_KEY_CHARS or len(key) > len(head)
        text = text[:MAX_KEY_CHARS]
    else:
        whole = str(key)
        size, cut = f"{len(whole):,} characters", len(whole) > MAX_KEY_CHARS
        text = _utf8(whole[:MAX_KEY_CHARS])  # escaped once cut: six characters at most for each one kept
    return text, f"key cut to its first {MAX_KEY_CHARS} characters (of {size})" if cut else ""


def dead_letter_value(topic: str, partition: int, offset: int, error: str, reason: str, raw: bytes | bytearray | str,
                      key: bytes | bytearray | str | None, ts: float) -> dict[str, Any]:
    """The dead-letters value of one record, bounded whatever the record: its first :data:`MAX_RAW_BYTES` in
    base64, its key's first :data:`MAX_KEY_CHARS` characters (bytes that are not UTF-8 replaced, a lone surrogate
    in a ``str`` written as its ``\\udXXX`` escape, as in the error), the error cut to 2,000 characters. What was
    cut is said at the end of ``error``. The value is about 100 KB at most, well within
    what a broker takes (1 MB by default).

    >>> d = dead_letter_value("t", -1, 3, "invalid_json: ...", "invalid_json", b"{", None, 0.0)
    >>> d["raw"], d["offset"], d["error"]
    ('ew==', 3, 'invalid_json: ...')
    >>> dead_letter_value("t", 0, 0, "e: x", "e", b"y" * 70_000, "n1", 0.0)["error"]
    'e: x; raw cut to its first 65,536 bytes (of 70,000)'
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)  # a lone surrogate kept
    text, key_cut = _key(key)
    cuts = [f"raw cut to its first {MAX_RAW_BYTES:,} bytes (of {len(data):,})"] if len(data) > MAX_RAW_BYTES else []
    cuts += [key_cut] if key_cut else []
    return {"topic": topic, "partition": partition, "offset": offset,
            "error": "; ".join([_utf8(error[:MAX_ERROR_CHARS]), *cuts]), "reason": reason,
            "raw": base64.b64encode(data[:MAX_RAW_BYTES]).decode("ascii"), "key": text, "ts": ts}


def dead_letter_record(message: Any, source: str, exc: ContractError, now: float) -> dict[str, Any]:
    """The dead-letters value for ``message`` (a Faust/aiokafka message) that failed with ``exc``.

    ``topic`` (and the dead letter's key) is the real Kafka topic the message came from, prefix included,
    as the bridge writes it; ``source`` (the contract name) is the fallback and the metric label.
    """
    raw = message.value if isinstance(message.value, bytes | bytearray) else _text(message.value) or ""
    key = message.key if message.key is None or isinstance(message.key, bytes | bytearray | str) else str(message.key)
    return dead_letter_value(str(getattr(message, "topic", None) or source), int(message.partition),
                             int(message.offset), str(exc), exc.reason, raw, key, now)
