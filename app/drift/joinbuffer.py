"""A bounded join buffer of completions and predictions keyed ``(task_id, node)``, with TTL and de-duplication.

Either side may arrive first. The first side of a key waits; when the other side arrives the pair is
*matched* and the key is kept, without its payloads, as *done* until its TTL runs out, so that an
at-least-once redelivery of either side is recognised as a *duplicate* and counted once. A key whose
other side never came expires after ``ttl_s`` (measured from the key's first arrival):

* a waiting completion expires as ``no_prediction`` (the task ran where nothing predicted it);
* a waiting prediction expires as ``expired`` (most of them: a prediction is made for every candidate
  node, the task runs on one);
* a done key leaves silently.

A key may also *hold* a value beside its sides (:meth:`JoinBuffer.hold`): the feedback join keeps there a
completion whose training sample cannot be made yet (its node's class unknown). A held value lives and
persists with its key; when the key leaves it comes out of :meth:`JoinBuffer.expire` as ``held``.

Memory is bounded by ``max_entries``: past it the oldest keys leave early, with the same outcomes.
Times come from an injected clock (wall-clock seconds, so that entries restored after a restart keep
their age). Changes are tracked for a changelog (:meth:`JoinBuffer.take_changes`) and each entry
round-trips through a plain dict (:meth:`JoinBuffer.export` / :meth:`JoinBuffer.load`).

>>> from app.clock import ManualClock
>>> clock = ManualClock(1000.0)
>>> jb = JoinBuffer(ttl_s=60.0, clock=clock)
>>> jb.add_completion(("t1", "n1"), {"rtt_ms": 110.0}).outcome
'waiting'
>>> r = jb.add_prediction(("t1", "n1"), {"predicted_rtt_ms": 100.0})
>>> r.outcome, r.completion, r.prediction
('matched', {'rtt_ms': 110.0}, {'predicted_rtt_ms': 100.0})
>>> jb.add_completion(("t1", "n1"), {"rtt_ms": 110.0}).outcome
'duplicate'
>>> _ = jb.add_prediction(("t2", "n1"), {"predicted_rtt_ms": 50.0})
>>> [(e.key, e.outcome) for e in clock.advance(61.0) and jb.expire()]
[(('t2', 'n1'), 'expired')]
>>> len(jb)
0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from app.clock import Clock, SystemClock

Key = tuple[str, str]  # (task_id, node)

WAITING, MATCHED, DUPLICATE = "waiting", "matched", "duplicate"
EXPIRED, NO_PREDICTION, HELD = "expired", "no_prediction", "held"


class _Entry:
    __slots__ = ("completion", "done", "held", "prediction", "since")

    def __init__(self, since: float, completion: Any = None, prediction: Any = None, done: bool = False,
                 held: Any = None) -> None:
        self.since = since
        self.completion = completion
        self.prediction = prediction
        self.done = done
        self.held = held


@dataclasses.dataclass(frozen=True)
class JoinResult:
    """What one arrival did: ``outcome`` is waiting | matched | duplicate; payloads of both sides if matched."""

    outcome: str
    completion: Any = None
    prediction: Any = None


@dataclasses.dataclass(frozen=True)
class Expired:
    """A key that left without a match: ``outcome`` is expired (a prediction) or no_prediction (a completion);
    or ``held``: the value a leaving key still held (reported besides its own outcome)."""

    key: Key
    outcome: str
    payload: Any


class JoinBuffer:
    """Completions ⨝ predictions on ``(task_id, node)``.

    Parameters
    ----------
    ttl_s
        How long a key is kept after its first arrival (waiting, or done for de-duplication), ``> 0``.
    max_entries
        Keys held at most; the oldest leave first, ``>= 1``.
    clock
        Source of ``now()`` (wall-clock seconds).
    """

    def __init__(self, ttl_s: float, max_entries: int = 500_000, clock: Clock | None = None) -> None:
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 (got {max_entries})")
        self.ttl_s = float(ttl_s)
        self.max_entries = int(max_entries)
        self.clock = clock or SystemClock()
        self._entries: dict[Key, _Entry] = {}  # insertion order = arrival order (restored entries are sorted)
        self._changed: set[Key] = set()
        self._removed: set[Key] = set()
        self._held: set[Key] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[Key]:
        return iter(list(self._entries))

    # -- arrivals --------------------------------------------------------------------------------
    def add_completion(self, key: Key, completion: Any) -> JoinResult:
        return self._add(key, completion, is_completion=True)

    def add_prediction(self, key: Key, prediction: Any) -> JoinResult:
        return self._add(key, prediction, is_completion=False)

    def _add(self, key: Key, payload: Any, *, is_completion: bool) -> JoinResult:
        e = self._entries.get(key)
        if e is None:
            e = _Entry(self.clock.now())
            if is_completion:
                e.completion = payload
            else:
                e.prediction = payload
            self._entries[key] = e
            self._touch(key)
            return JoinResult(WAITING)
        if e.done or (e.completion is not None if is_completion else e.prediction is not None):
            return JoinResult(DUPLICATE)
        completion = payload if is_completion else e.completion
        prediction = e.prediction if is_completion else payload
        e.completion = e.prediction = None
        e.done = True
        self._touch(key)
        return JoinResult(MATCHED, completion, prediction)

    # -- held values -----------------------------------------------------------------------------
    @property
    def held_keys(self) -> set[Key]:
        """The keys holding a value (read only)."""
        return self._held

    def hold(self, key: Key, value: Any) -> None:
        """Keep ``value`` with ``key`` (which must be present) until :meth:`release` or the key leaves."""
        self._entries[key].held = value
        self._held.add(key)
        self._touch(key)

    def held(self) -> list[tuple[Key, Any]]:
        """``[(key, held value)]``, oldest key first."""
        if not self._held:
            return []
        return sorted(((k, self._entries[k].held) for k in self._held), key=lambda kv: self._entries[kv[0]].since)

    def held_value(self, key: Key) -> Any:
        e = self._entries.get(key)
        return None if e is None else e.held

    def release(self, key: Key) -> None:
        """Let go of the value held with ``key`` (if any)."""
        e = self._entries.get(key)
        if e is not None and e.held is not None:
            e.held = None
            self._held.discard(key)
            self._touch(key)

    def _touch(self, key: Key) -> None:
        self._changed.add(key)
        self._removed.discard(key)

    # -- leaving ---------------------------------------------------------------------------------
    def expire(self, now: float | None = None) -> list[Expired]:
        """Remove keys older than the TTL, and the oldest beyond ``max_entries``; the unmatched ones."""
        limit = (self.clock.now() if now is None else now) - self.ttl_s
        out: list[Expired] = []
        entries = self._entries
        while entries:
            key = next(iter(entries))
            e = entries[key]
            if e.since > limit and len(entries) <= self.max_entries:
                break
            del entries[key]
            self._changed.discard(key)
            self._removed.add(key)
            if not e.done:
                outcome = NO_PREDICTION if e.completion is not None else EXPIRED
                out.append(Expired(key, outcome, e.completion if e.completion is not None else e.prediction))
            if e.held is not None:
                self._held.discard(key)
                out.append(Expired(key, HELD, e.held))
        return out

    def drop(self, keep: Any) -> int:
        """Forget (without outcomes or changes) every key for which ``keep(key)`` is false; how many."""
        gone = [k for k in self._entries if not keep(k)]
        for k in gone:
            del self._entries[k]
            self._changed.discard(k)
            self._removed.discard(k)
            self._held.discard(k)
        return len(gone)

    # -- persistence -----------------------------------------------------------------------------
    def export(self, key: Key) -> dict[str, Any] | None:
        """The entry of ``key`` as a plain dict (None if absent)."""
        e = self._entries.get(key)
        if e is None:
            return None
        d = {"since": e.since, "c": e.completion, "p": e.prediction, "done": e.done}
        if e.held is not None:
            d["h"] = e.held
        return d

    def load(self, items: Mapping[Key, Mapping[str, Any]]) -> int:
        """Put back exported entries (restored keys are not marked changed); keeps arrival order by age."""
        for key, d in items.items():
            self._entries[key] = _Entry(float(d["since"]), d.get("c"), d.get("p"), bool(d.get("done")), d.get("h"))
            if d.get("h") is not None:
                self._held.add(key)
        self._entries = dict(sorted(self._entries.items(), key=lambda kv: kv[1].since))
        return len(items)

    def retake(self, upserts: Iterable[Key], removed: Iterable[Key]) -> None:
        """Track again the changes a changelog write took and did not store (those not overtaken since)."""
        for key in upserts:
            if key in self._entries:
                self._changed.add(key)
        for key in removed:
            if key not in self._entries:
                self._removed.add(key)

    def take_changes(self) -> tuple[dict[Key, dict[str, Any]], set[Key]]:
        """``(upserts, deletions)`` since the last call, for a changelog."""
        upserts = {k: d for k in self._changed if (d := self.export(k)) is not None}
        removed = self._removed
        self._changed, self._removed = set(), set()
        return upserts, removed
