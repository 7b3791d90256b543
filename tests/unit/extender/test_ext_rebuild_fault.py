"""A build that fails (a value the snapshot cannot take) leaves the last snapshot in service and the background
rebuilder alive: the next build installs what came since."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from app.config import Settings
from app.extender.service import ExtenderService


def features(node: str, ts: float) -> dict[str, Any]:
    return {"node": node, "ts": ts, "node_class": "cpu", "window_s": 30, "count": 1, "features": {"a__mean": 1.0}}


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


def test_a_failed_build_keeps_the_last_snapshot_and_the_rebuilder(caplog) -> None:
    async def run() -> None:
        svc = ExtenderService(Settings.from_env({}), kafka=False, redis=False, publish=False)
        await svc.start()
        try:
            svc.builder.apply_node_features(features("good", 1.0))
            svc.request_rebuild(force=True)
            await until(lambda: svc.holder.current is not None and "good" in svc.holder.current.nodes)
            real, failures = svc.builder.build_steps, [1]

            def build_steps(now: float) -> Any:
                if failures:
                    failures.pop()
                    raise OverflowError("Python int too large to convert to C long")
                return real(now)

            svc.builder.build_steps = build_steps  # type: ignore[method-assign]
            svc.builder.apply_node_features(features("later", 2.0))
            svc.request_rebuild()
            await until(lambda: not failures)
            assert "later" not in svc.holder.current.nodes and "good" in svc.holder.current.nodes
            svc.request_rebuild()
            await until(lambda: "later" in svc.holder.current.nodes)  # the rebuilder lived on
        finally:
            await svc.stop()

    with caplog.at_level(logging.ERROR, logger="app.extender.service"):
        asyncio.run(run())
    assert any("snapshot build failed (OverflowError" in r.getMessage() for r in caplog.records)
