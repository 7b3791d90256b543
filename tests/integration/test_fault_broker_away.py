"""The broker goes away for 50 s under the running worker, trainer and extender, then comes back empty.

Nobody exits — the worker used to, about 40 s in (the producer's request timeout), when a checkpoint's
write failed inside a Faust timer; the extender answers ready from what it holds; and each process logs
aiokafka's per-retry errors once per period with a count of those held back — before, a worker logged
about 310 such lines a second and a trainer 160, burying everything else. Once the broker is back, every
task produced has its training sample and its pair counted once.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest
from fault_outages import broker_away
from fault_stack import Load, Stack

pytestmark = pytest.mark.integration


def test_broker_away_under_the_running_processes(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    try:
        stack.start()
        outcome = asyncio.run(broker_away(stack, Load(stack.settings), away_s=50.0))
    finally:
        stack.stop()
    assert outcome.dead == 0, stack.dead()
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
    assert "extender ready throughout: True" in outcome.detail, outcome.detail
    found = re.search(r"during the outage: (\{[^}]*\})", outcome.detail)
    assert found, outcome.detail
    lines = ast.literal_eval(found.group(1))
    assert set(lines) == {"worker", "trainer", "extender"}, lines
    # at most each of the 9 recurring messages once per 10 s over 50 s (6 periods), and a few others;
    # without the limit a worker logs about 15,000
    assert max(lines.values()) <= 80, lines
