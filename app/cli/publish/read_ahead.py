"""``rttsched publish``'s input: the records of a stream, read by a thread of their own ahead of the producer."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator

    from app.bridge.records import Record

READ_AHEAD = 4000  # records read and not yet taken, at most (four of publish's batches): the reading thread waits
#                    while there are this many


class _End:
    """Put after the last record; ``error``: what stopped the reading, raised again where records are taken."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class ReadAhead:
    """The records of a stream (:func:`~app.bridge.records.read_records`), read by a daemon thread at most
    :data:`READ_AHEAD` ahead of the event loop, which can tell when the input has nothing more for now
    (:meth:`empty`). The thread wakes the loop once per run of records, not once per record. A daemon thread, since
    a blocking read of a pipe cannot be interrupted: Ctrl-C still ends the process."""

    def __init__(self, stream: BinaryIO) -> None:
        import collections

        self._stream = stream
        self._items: collections.deque[Record | _End] = collections.deque()  # appended there, taken here
        self._room = threading.Event()  # set when there is room again after the thread found none
        self._full = False  # the thread found no room and waits for some
        self._stopped = False
        self._waking = False  # a wake-up of the loop is on its way
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived: asyncio.Event | None = None
        self._end: _End | None = None  # taken: no record comes after it

    def start(self) -> None:
        import asyncio

        from app.bridge import records  # looked up now, not at import

        self._loop, self._arrived = asyncio.get_running_loop(), asyncio.Event()
        self._thread = threading.Thread(target=self._read, args=(records.read_records,),
                                        name="rttsched-publish-read", daemon=True)
        self._thread.start()

    def _read(self, read_records: Callable[[BinaryIO], Iterator[Record]]) -> None:
        end = _End(None)
        try:
            for record in read_records(self._stream):
                if not self._put(record):
                    return
        except BaseException as exc:  # what stopped the reading (an unreadable file): raised again by take()
            end = _End(exc)
        self._put(end)

    def _put(self, item: Record | _End) -> bool:
        """Hand ``item`` over, once there is room; False when nothing takes records any more."""
        assert self._loop is not None
        while len(self._items) >= READ_AHEAD and not self._stopped:
            self._room.clear()
            self._full = True
            if len(self._items) >= READ_AHEAD:  # still none, now that take() knows to make some
                self._room.wait()
        if self._stopped:
            return False
        self._items.append(item)
        if not self._waking:
            self._waking = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed
                return False
        return True

    def _wake(self) -> None:  # in the loop
        assert self._arrived is not None
        self._waking = False
        self._arrived.set()

    def empty(self) -> bool:
        """Whether every record read so far has been taken."""
        return not self._items

    def drain(self) -> list[Record]:
        """The records read and not yet taken, without waiting (what the thread appends meanwhile stays)."""
        out: list[Record] = []
        for _ in range(len(self._items) if self._end is None else 0):
            item = self._items.popleft()
            if isinstance(item, _End):
                self._end = item
                break
            out.append(item)
        return out

    async def take(self) -> list[Record]:
        """The records read and not yet taken, waiting for one; [] after the last; raises what stopped the
        reading once the records read before it have been taken."""
        assert self._arrived is not None and self._thread is not None
        if self._end is None:
            while not self._items:
                self._arrived.clear()
                if not self._items:  # an item put from now on sets it again (or a wake-up on its way does)
                    await self._arrived.wait()
            out: list[Record] = []
            for _ in range(len(self._items)):  # those there now: the thread appends on meanwhile
                item = self._items.popleft()
                if isinstance(item, _End):
                    self._end = item
                    break
                out.append(item)
            if self._full and len(self._items) <= READ_AHEAD // 2:
                self._full = False
                self._room.set()
            if out:
                return out
        assert self._end is not None
        self._thread.join()  # its last act was to put the end
        if self._end.error is not None:
            raise self._end.error
        return []

    def stop(self, wait_s: float) -> bool:
        """Tell the thread to read no further (it ends at its next record); whether it has ended within
        ``wait_s`` -- not while blocked in a read of a pipe that has nothing to say."""
        if self._thread is None:
            return True
        self._stopped = True
        self._room.set()  # a thread waiting for room wakes up, and ends
        self._thread.join(wait_s)
        return not self._thread.is_alive()
