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

Memory is bounded by ``max_entries``: past it keys leave early, with the same outcomes. The first to go are
the *spare* predictions, oldest first: waiting predictions not marked ``chosen`` (a pod is predicted on
every candidate node, and ``chosen`` marks the one the scheduler expects it to run on, so the others rarely
match); only when none is left do the oldest keys go, whatever they hold. A spare still matches while it is
there (a pod placed elsewhere than expected), and leaves the spares when it does.

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

Past ``max_entries`` the spare predictions leave before an older chosen one:

>>> jb = JoinBuffer(ttl_s=60.0, max_entries=2, clock=clock)
>>> _ = jb.add_prediction(("t3", "n1"), {"predicted_rtt_ms": 80.0}, chosen=True)
>>> _ = jb.add_prediction(("t3", "n2"), {"predicted_rtt_ms": 90.0})
>>> _ = jb.add_prediction(("t3", "n3"), {"predicted_rtt_ms": 95.0})
>>> [(e.key, e.outcome) for e in jb.expire()]
[(('t3', 'n2'), 'expired')]
>>> jb.add_completion(("t3", "n1"), {"rtt_ms": 85.0}).outcome
'matched'
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from app.clock import Clock, SystemClock

Key = tuple[str, str]  # (task_id, node)

WAITING, MATCHED, DUPLICATE = "waiting", "matched", "duplicate"
EXPIRED, NO_PREDICTION, HELD = "expired", "no_prediction", "held"


class _Entry:
    __slots__ = ("chosen", "completion", "done", "held", "prediction", "since")

    def __init__(self, since: float, completion: Any = None, prediction: Any = None, done: bool = False,
                 held: Any = None, chosen: bool = False) -> None:
        self.since = since
        self.completion = completion
        self.prediction = prediction
        self.done = done
        self.held = held
        self.chosen = chosen  # a waiting prediction for the node the pod is expected on (not a spare)

    @property
    def spare(self) -> bool:
        """A waiting prediction not chosen: the first to leave past ``max_entries``."""
        return not (self.done or self.chosen) and self.completion is None and self.prediction is not None


@dataclasses.dataclass(frozen=True)
class JoinResult:
    """What one arrival did: ``outcome`` is waiting | matched | duplicate; payloads of both sides if matched."""

    outcome: str
    completion: Any = None
    prediction: Any = None


_WAITING, _DUPLICATE = JoinResult(WAITING), JoinResult(DUPLICATE)  # shared: they carry no payload


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
        Keys held at most, ``>= 1``; past it the spare predictions leave first (oldest first), then the oldest
        keys.
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
        self._spare: dict[Key, None] = {}  # the spare predictions' keys, in the same order
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

    def add_prediction(self, key: Key, prediction: Any, chosen: bool = False) -> JoinResult:
        """``chosen``: the prediction is for the node the pod is expected to run on (kept past ``max_entries``
        while spare predictions are left); a chosen copy of a waiting spare makes it chosen."""
        return self._add(key, prediction, is_completion=False, chosen=chosen)

    def _add(self, key: Key, payload: Any, *, is_completion: bool, chosen: bool = False) -> JoinResult:
        e = self._entries.get(key)
        if e is None:
            e = _Entry(self.clock.now())
            if is_completion:
                e.completion = payload
            else:
                e.prediction = payload
                e.chosen = chosen
                if not chosen and payload is not None:  # a spare
                    self._spare[key] = None
            self._entries[key] = e
            self._touch(key)
            return _WAITING
        if e.done or (e.completion is not None if is_completion else e.prediction is not None):
            if chosen and e.spare:  # decided again, for this node: no longer a spare
                e.chosen = True
                del self._spare[key]
                self._touch(key)
            return _DUPLICATE
        completion = payload if is_completion else e.completion
        prediction = e.prediction if is_completion else payload
        if is_completion:
            self._spare.pop(key, None)
        e.completion = e.prediction = None
        e.done, e.chosen = True, False
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
        """Remove keys older than the TTL, then beyond ``max_entries`` the oldest spare predictions and, when
        none is left, the oldest keys; the unmatched ones (in that order).

        Each step collects its keys in one pass before removing them: looking up a dict's first key again after
        each removal passes over every slot removed before it (seconds per call at 500,000 keys).
        """
        limit = (self.clock.now() if now is None else now) - self.ttl_s
        out: list[Expired] = []
        entries = self._entries
        old = list(itertools.takewhile(lambda key: entries[key].since <= limit, entries))
        self._leave(old, out)
        over = len(entries) - self.max_entries
        if over > 0:
            spares = list(itertools.islice(self._spare, over))
            self._leave(spares, out)
            if over > len(spares):
                self._leave(list(itertools.islice(entries, over - len(spares))), out)
        return out

    def _leave(self, keys: list[Key], out: list[Expired]) -> None:
        entries, spare = self._entries, self._spare
        for key in keys:
            e = entries.pop(key)
            self._changed.discard(key)
            self._removed.add(key)
            if not e.done:
                if e.completion is not None:
                    out.append(Expired(key, NO_PREDICTION, e.completion))
                else:
                    out.append(Expired(key, EXPIRED, e.prediction))
                    spare.pop(key, None)
            if e.held is not None:
                self._held.discard(key)
                out.append(Expired(key, HELD, e.held))

    def drop(self, keep: Any) -> int:
        """Forget (without outcomes or changes) every key for which ``keep(key)`` is false; how many."""
        gone = [k for k in self._entries if not keep(k)]
        for k in gone:
            del self._entries[k]
            self._spare.pop(k, None)
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
        if e.chosen:
            d["chosen"] = True
        return d

    def load(self, items: Mapping[Key, Mapping[str, Any]]) -> int:
        """Put back exported entries (restored keys are not marked changed); keeps arrival order by age. An entry
        exported without ``chosen`` is not chosen (as a prediction without it)."""
        for key, d in items.items():
            self._entries[key] = _Entry(float(d["since"]), d.get("c"), d.get("p"), bool(d.get("done")), d.get("h"),
                                        d.get("chosen") is True)
            if d.get("h") is not None:
                self._held.add(key)
        self._entries = dict(sorted(self._entries.items(), key=lambda kv: kv[1].since))
        self._spare = {k: None for k, e in self._entries.items() if e.spare}
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
