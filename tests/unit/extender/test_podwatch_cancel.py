"""The pods watcher's loop ends when its task is cancelled, even when the cancel is caught on its way and comes out
as a failed try (a client library that took it for its own timeout): the task is still cancelling, and the loop
does not try again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.extender.podwatch import PodWatcher, PodWatchOptions
from app.extender.podwatch_api import KubeApiError
from app.scheduler.cache import CacheKeys


class SwallowingApi:
    """A pods API whose list, cancelled the first time, raises its own error instead of the cancel."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.tries = 0
        self.listing = asyncio.Event()

    async def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        self.tries += 1
        self.listing.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if self.tries > 1:  # the next cancel goes through: a loop that tried again can still be stopped
                raise
            raise self.error from None
        return [], "1"


@pytest.mark.parametrize("error", [KubeApiError("timeout", "no complete answer"), OSError("reset")])
async def test_a_cancel_caught_as_a_failed_try_still_ends_the_loop(error: BaseException) -> None:
    api = SwallowingApi(error)
    watcher = PodWatcher(api, None, CacheKeys("t-"),  # type: ignore[arg-type]
                         PodWatchOptions(backoff_initial_s=0.01, backoff_max_s=0.01))
    task = asyncio.ensure_future(watcher.run())
    await asyncio.wait_for(api.listing.wait(), 5.0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2.0)
    if not done:
        task.cancel()  # the old loop: stop it for good before failing
        await asyncio.gather(task, return_exceptions=True)
    assert done and task.cancelled(), f"the loop tried again {api.tries - 1} time(s) after its cancel"
    assert api.tries == 1
