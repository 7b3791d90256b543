"""What the scheduling layer remembers per object between requests: a small bounded memo keyed by an object's id.

Hashing an immutable object's contents (a policy, a model entry's feature names) on every request costs more than
looking it up by ``id``; the id alone is not enough, since a freed object's id can be reused by a new one, so each
value is stored with the object (or a weak reference to it) and a hit must be that very object.

>>> class Entry: pass
>>> memo = ByIdentity(limit=2, weak=True)
>>> e = Entry()
>>> memo.get(e, "spec", lambda: [1, 2]) is memo.get(e, "spec", lambda: [3])
True
>>> memo.get(Entry(), "spec", lambda: [3])  # another object: computed afresh
[3]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """Values computed from an object, remembered per ``(id(object), key)`` with an identity check.

    Parameters
    ----------
    limit
        At most this many values; one more starts the memo afresh (a bound, not an LRU: the keys in use are few).
    weak
        Hold each object weakly, so that remembering a value keeps nothing alive (a model entry replaced by a
        retrain is freed once no snapshot refers to it; its id, reused, finds its reference dead). Otherwise each
        object is held until the memo starts afresh.
    """

    def __init__(self, limit: int, *, weak: bool = False) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1 (got {limit})")
        self.limit = int(limit)
        self.weak = bool(weak)
        self._memo: dict[tuple[int, Hashable], tuple[Any, V]] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def get(self, obj: object, key: Hashable, make: Callable[[], V]) -> V:
        """The value remembered for ``obj`` and ``key``, else ``make()``, remembered."""
        k = (id(obj), key)
        hit = self._memo.get(k)
        if hit is not None and (hit[0]() if self.weak else hit[0]) is obj:
            return hit[1]
        if len(self._memo) >= self.limit:
            self._memo.clear()
        value = make()
        self._memo[k] = (weakref.ref(obj) if self.weak else obj, value)
        return value

    def clear(self) -> None:
        self._memo.clear()
