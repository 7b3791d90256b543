"""Replacing a snapshot frees the node states only the old one held in slices, not in the swap's loop step."""

from __future__ import annotations

import asyncio
import gc

from extender_fixtures import NOW, make_service

from app.extender.pacing import Slicer, release_sliced
from app.scheduler.entries import NodeState

N = 300


def live_states() -> int:
    """This module's node states alive (type(), not isinstance(): a dead weak proxy raises on the latter)."""
    gc.collect()
    return sum(type(o) is NodeState and o.name.startswith("release-") for o in gc.get_objects())


def refresh_all(service: object, ts: float) -> None:
    b = service.builder  # type: ignore[attr-defined]
    for i in range(N):
        b.apply_node_features({"node": f"release-{i}", "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40",
                               "window_s": 30.0, "count": 30, "features": {"load__mean": float(i)}})


async def test_old_states_are_released_by_a_task_after_the_swap() -> None:
    service = make_service(populate=False)
    refresh_all(service, NOW - 2)
    service.rebuild(force=True)
    base = live_states()
    refresh_all(service, NOW - 1)  # every node replaced: the old states are held by the installed snapshot only
    assert service.rebuild()
    assert len(service._releasing) == 1
    assert live_states() >= base + N  # not freed in the swap's step: the release task holds them
    await asyncio.gather(*service._releasing)
    assert not service._releasing
    assert live_states() == base  # the old snapshot's states are gone, the new ones remain
    assert service.holder.current is not None and len(service.holder.current.nodes) == N


def test_without_a_running_loop_the_old_snapshot_is_freed_at_once() -> None:
    service = make_service(populate=False)
    refresh_all(service, NOW - 2)
    service.rebuild(force=True)
    base = live_states()
    refresh_all(service, NOW - 1)
    assert service.rebuild()
    assert not service._releasing
    assert live_states() == base


async def test_stop_finishes_a_release_in_progress() -> None:
    service = make_service(populate=False)
    refresh_all(service, NOW - 2)
    service.rebuild(force=True)
    base = live_states()
    refresh_all(service, NOW - 1)
    service.rebuild()
    assert service._releasing
    await service.stop()
    await asyncio.sleep(0)  # the tasks' done callbacks
    assert not service._releasing
    assert live_states() == base


async def test_release_sliced_yields_to_the_loop_between_slices() -> None:
    items: list[object] = [[j] for j in range(20_000)]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while items:
            ticks += 1
            await asyncio.sleep(0)


    await asyncio.gather(release_sliced(items, Slicer(1e-6)), ticker())
    assert items == []
    assert ticks > 10  # the loop ran other work while the references were dropped


async def test_a_cancelled_release_drops_the_rest_at_once() -> None:

    items: list[object] = [[j] for j in range(20_000)]
    task = asyncio.ensure_future(release_sliced(items, Slicer(1e-9)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert 0 < len(items) < 20_000  # started, not finished
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert items == []
