"""Redis restarted without its data under the running processes: the registry is empty and its version
counter starts again at 1, below the v1 every process holds. The trainer's registry check trains a model from
its sample history and announces it above v1; the worker and an extender started after the wipe serve it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fault_outages import redis_wiped
from fault_stack import Load, stack_on_redis

pytestmark = pytest.mark.integration


def test_redis_restarted_without_its_data(tmp_path: Path) -> None:
    with stack_on_redis(tmp_path, persist=False, trainer_env={"RTT_REGISTRY_CHECK_S": "1"}) as (stack, server):
        outcome = asyncio.run(redis_wiped(stack, Load(stack.settings), server))
    assert outcome.dead == 0, stack.dead()
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
