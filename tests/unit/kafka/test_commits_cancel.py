"""A group's rebalance listener ends when cancelled, even as its check or its commit is answered.

:class:`~app.kafka.commits.GroupCommits` runs in the consumer's rebalance (aiokafka's coordination task): it checks
the committed positions of assigned partitions and commits what is done of revoked ones. The trainer's stop bounds
the retrain-events consumer's stop, and that bound cancels the coordination task. Both calls were bounded by
``asyncio.wait_for``, which in Python 3.11 drops a cancel that comes in the turn of the event loop its answer lands
in: the rebalance ran on (after a revoke, into a JoinGroup with the broker) and the stop waited for it past its
bound.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from lost_cancel import AnsweredAsCancelled, ends_cancelled

from app.kafka.commits import GroupCommits

TP = TopicPartition("t-retrain-events", 1)


def group(consumer: Any = None, check: Any = None) -> GroupCommits:
    guard = SimpleNamespace(check_committed=check, confirm_s=1.0, client="test", forget=lambda _tps: None)
    return GroupCommits(consumer, guard, timeout_s=5.0)  # type: ignore[arg-type]


async def test_a_cancel_as_the_assigned_positions_are_checked_ends_the_listener() -> None:
    check = AnsweredAsCancelled(answer=({TP: 4}, {}))
    commits = group(check=check)
    assert await ends_cancelled(check, commits.on_partitions_assigned([TP])), "the assignment ran on"
    assert check.calls == 1


@pytest.mark.parametrize(("ending", "ran_on"), [
    (lambda commits: commits.on_partitions_revoked([TP]), "the revoke ran on"),
    (lambda commits: commits.flush(), "the flush returned as if not cancelled"),
], ids=["a-revoked-partitions-commit-ends-the-listener", "the-stops-commit-ends-the-flush"])
async def test_a_cancel_as_a_commit_is_answered_ends_what_commits(
        ending: Callable[[GroupCommits], Coroutine[Any, Any, object]], ran_on: str) -> None:
    commit = AnsweredAsCancelled()
    commits = group(consumer=SimpleNamespace(assignment=lambda: {TP}, commit=commit))
    commits.ledger.start(TP, 4)
    commits.done(commits.read(TP, 4))
    assert await ends_cancelled(commit, ending(commits)), ran_on
    assert commit.calls == 1
