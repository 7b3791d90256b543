"""What a task-completions message says about the node that ran the task.

A placement decides where a task runs, not how long it waited to be placed: every candidate node would
have seen the same wait. The models therefore learn, and the feedback loop judges them on, the task's
time on its node, ``finished_ts - started_ts``; ``rtt_ms`` (from submission) when the start is missing,
not before the finish, or so early that the time on the node would exceed the whole response time (a start
stamped by a wrong clock: the node's time is part of the RTT).

>>> service_ms({"submitted_ts": 10.0, "started_ts": 12.0, "finished_ts": 12.25, "rtt_ms": 2250.0})
250.0
>>> service_ms({"submitted_ts": 10.0, "started_ts": 13.0, "finished_ts": 12.0, "rtt_ms": 2000.0})
2000.0
>>> service_ms({"submitted_ts": 1.7e9, "started_ts": 1.0, "finished_ts": 1.7e9 + 2, "rtt_ms": 2000.0})
2000.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def service_ms(completion: Mapping[str, Any]) -> float:
    """The task's time on its node in ms (see the module docstring)."""
    start, end = completion.get("started_ts"), completion.get("finished_ts")
    rtt = float(completion["rtt_ms"])
    if isinstance(start, int | float) and isinstance(end, int | float) and math.isfinite(start) and end > start:
        return min((float(end) - float(start)) * 1000.0, rtt)
    return rtt
