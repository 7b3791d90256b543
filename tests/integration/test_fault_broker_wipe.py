"""The broker loses its data mid-stream (memory-only Tansu SIGKILLed, restarted empty, topics recreated).

Every consumer held read positions beyond the new partitions' ends; without the position checks they
skipped the first messages of every partition and model v2, announced on the recreated model-updates,
never reached the worker or the extender. Here: no process dies, nothing produced after the restart is
skipped or counted twice, and v2 is served by the worker and the extender. The recreated changelogs hold
every node's window and tracker again (one node runs no task after the wipe, so nothing of it changes):
a worker started afterwards restores them all.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest
from fault_outages import broker_wipe
from fault_stack import Load, Stack

pytestmark = pytest.mark.integration


def test_broker_wiped_and_restarted_mid_stream(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    try:
        stack.start()
        outcome = asyncio.run(broker_wipe(stack, Load(stack.settings)))
    finally:
        stack.stop()
    assert outcome.dead == 0, stack.dead()
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
    assert "position resets 0" not in outcome.detail
    found = re.search(r"changelog partitions found recreated (\{[^}]*\})", outcome.detail)
    assert found, outcome.detail
    rewinds = ast.literal_eval(found.group(1))
    assert set(rewinds) == {"node-window", "feedback"} and min(rewinds.values()) >= 1, rewinds
