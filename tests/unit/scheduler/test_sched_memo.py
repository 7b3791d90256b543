"""The scheduling layer's per-object memo: a hit is the very object, a weak memo keeps nothing alive, and the
bound starts it afresh."""

from __future__ import annotations

import gc
import weakref

import pytest

from app.scheduler.memo import ByIdentity


class Entry:
    """A stand-in for a model entry or policy (any object that can be referenced weakly)."""


def test_a_value_is_made_once_per_object_and_key() -> None:
    memo: ByIdentity[list[int]] = ByIdentity(8)
    a, b = Entry(), Entry()
    made: list[str] = []

    def make(tag: str) -> list[int]:
        made.append(tag)
        return [len(made)]

    first = memo.get(a, "k", lambda: make("a"))
    assert memo.get(a, "k", lambda: make("again")) is first
    assert memo.get(a, "other", lambda: make("a-other")) is not first
    assert memo.get(b, "k", lambda: make("b")) is not first
    assert made == ["a", "a-other", "b"]


@pytest.mark.parametrize("weak", [False, True])
def test_a_reused_id_never_finds_the_value_of_the_object_gone(weak: bool) -> None:
    memo: ByIdentity[str] = ByIdentity(8, weak=weak)
    for k in range(50):  # CPython reuses the id of a freed object soon
        obj = Entry()
        assert memo.get(obj, "k", lambda k=k: f"v{k}") == f"v{k}"  # type: ignore[misc]
        del obj
        gc.collect()


def test_a_weak_memo_keeps_nothing_alive_and_a_strong_one_holds_its_objects() -> None:
    weak: ByIdentity[int] = ByIdentity(8, weak=True)
    strong: ByIdentity[int] = ByIdentity(8)
    held, kept = Entry(), Entry()
    weak.get(held, "k", lambda: 1)
    strong.get(kept, "k", lambda: 1)
    held_ref, kept_ref = weakref.ref(held), weakref.ref(kept)
    del held, kept
    gc.collect()
    assert held_ref() is None
    assert kept_ref() is not None


def test_the_bound_starts_the_memo_afresh() -> None:
    memo: ByIdentity[int] = ByIdentity(3)
    objs = [Entry() for _ in range(4)]
    for i, o in enumerate(objs[:3]):
        memo.get(o, "k", lambda i=i: i)  # type: ignore[misc]
    assert len(memo) == 3
    memo.get(objs[3], "k", lambda: 3)
    assert len(memo) == 1
    assert memo.get(objs[0], "k", lambda: 10) == 10  # made again


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        ByIdentity(0)
