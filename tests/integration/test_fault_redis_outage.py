"""Redis stopped and started under the processes: nobody dies, nothing announced or asked for is lost.

While Redis is away a model-updates message arrives (the worker used to die on it), a retrain is asked
for (it used to fail for good), the worker is restarted (it used to exit after 9 s) and the extender is
restarted (it used to stay without models for a minute after Redis came back). Here the worker and the
extender run degraded — reported by ``/readyz`` and ``rtt_worker_degraded`` — and once Redis is back the
deferred model loads and the retrain are retried until done: both serve the retrain's model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fault_outages import redis_outage
from fault_stack import Load, stack_on_redis

pytestmark = pytest.mark.integration


def test_redis_stopped_and_started_under_the_processes(tmp_path: Path) -> None:
    with stack_on_redis(tmp_path) as (stack, server):
        outcome = asyncio.run(redis_outage(stack, Load(stack.settings), server))
    assert outcome.dead == 0, stack.dead()
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
    # reasons are listed sorted: model_store first, redis_cache (the cache write) possibly after it
    assert "running worker ['model_store'" in outcome.detail, outcome.detail
    assert "restarted worker ['model_store'" in outcome.detail, outcome.detail
    # the restarted extender said so while Redis was away: no models from the store, no running-pods view
    assert "restarted extender ['model_store', 'running_view']" in outcome.detail, outcome.detail
    assert "extender degraded {}" in outcome.detail, outcome.detail
