"""What a valid message must also satisfy at the edge, beyond its schema: its key and its time.

* **Key**: a topic keyed by node carries the node's name as its key (the partition follows the key, so a
  message whose key names another node is read by the wrong worker), one keyed by model key its
  ``model_key``; a mismatch (or no key) is ``key_mismatch``.
* **Time**: a message's event time (``ts``; ``finished_ts`` of a completion; ``started_ts`` of a training sample)
  later than now plus ``max_skew_s`` is ``ts_in_future`` (it would freeze the node's window: every later snapshot
  would look late; a training sample would sit in every holdout of its key), earlier than now minus ``max_age_s``
  is ``ts_too_old``. Both go to dead-letters with the reason. A consumer that keeps old messages by design (the
  trainer's sample history, the extender's views) passes ``max_age_s=math.inf``.
* **Order**: a completion that finished before it started (both stamped on its node) is
  ``finished_before_start``: its time on the node is negative, and a span ending before it starts is
  refused the same way (``bad_span``). The submission time may come from another clock and is not compared.

Pure functions: the caller passes "now" (its clock).

>>> check_key("node-metrics", b"gpu-1", {"node": "gpu-1"})
>>> check_key("node-metrics", b"gpu-2", {"node": "gpu-1"})
Traceback (most recent call last):
...
app.errors.ContractError: key_mismatch: key 'gpu-2', payload node 'gpu-1'
>>> check_time("node-metrics", {"ts": 9.9e10}, now=1.7e9, max_skew_s=300, max_age_s=86400)
Traceback (most recent call last):
...
app.errors.ContractError: ts_in_future: ts 99000000000.0 is 97300000000 s ahead of this clock (limit 300 s)
>>> check_time("task-completions", {"finished_ts": 1.7e9 - 10}, now=1.7e9, max_skew_s=300, max_age_s=86400)
>>> check_order("task-completions", {"started_ts": 12.0, "finished_ts": 11.5})
Traceback (most recent call last):
...
app.errors.ContractError: finished_before_start: finished_ts 11.5 is 0.5 s before started_ts 12.0
>>> check_order("task-completions", {"started_ts": None, "finished_ts": 11.5})
"""

from __future__ import annotations

from typing import Any

from app.errors import ContractError

NODE_KEYED = frozenset({"node-metrics", "task-completions", "rtt-predictions", "node-features", "node-weights",
                        "prediction-errors"})
MODEL_KEYED = frozenset({"training-samples", "retrain-events", "model-updates"})
TIME_FIELD = {"node-metrics": "ts", "task-completions": "finished_ts", "rtt-predictions": "ts",
              "node-features": "ts", "node-weights": "ts", "training-samples": "started_ts"}


def check_key(topic: str, key: bytes | None, value: dict[str, Any]) -> None:
    """Raise ``key_mismatch`` when ``topic``'s key is not the payload's node (or model key)."""
    field = "node" if topic in NODE_KEYED else "model_key" if topic in MODEL_KEYED else None
    if field is None:
        return
    expected = value.get(field)
    if key is None or key.decode("utf-8", "replace") != expected:
        shown = None if key is None else key.decode("utf-8", "replace")[:253]
        raise ContractError("key_mismatch", f"key {shown!r}, payload {field.replace('_', ' ')} {expected!r}")


def check_time(topic: str, value: dict[str, Any], *, now: float, max_skew_s: float, max_age_s: float) -> None:
    """Raise ``ts_in_future`` / ``ts_too_old`` when the message's event time is outside the accepted range."""
    field = TIME_FIELD.get(topic)
    if field is None:
        return
    ts = value.get(field)
    if not isinstance(ts, int | float):
        return
    if ts > now + max_skew_s:
        raise ContractError("ts_in_future", f"{field} {ts} is {ts - now:.0f} s ahead of this clock"
                            f" (limit {max_skew_s:g} s)")
    if ts < now - max_age_s:
        raise ContractError("ts_too_old", f"{field} {ts} is {now - ts:.0f} s old (limit {max_age_s:g} s)")


def check_order(topic: str, value: dict[str, Any]) -> None:
    """``finished_before_start`` for a task completion whose ``finished_ts`` is before its ``started_ts``."""
    if topic != "task-completions":
        return
    start, end = value.get("started_ts"), value.get("finished_ts")
    if isinstance(start, int | float) and isinstance(end, int | float) and end < start:
        raise ContractError("finished_before_start",
                            f"finished_ts {end} is {start - end:g} s before started_ts {start}")
