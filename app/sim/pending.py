"""Tasks no node has room for, retried as kube-scheduler retries Pending pods.

kube-scheduler parks a pod that fails the filter in its unschedulable pool and moves it back when a
cluster event could make it fit - an assigned pod deleted (a task ended, freeing requests) or a node
added - then tries the pods in queue order (PrioritySort: equal priority, so arrival order). Since
``SchedulerPopFromBackoffQ`` (beta and on by default from v1.33, ``pkg/scheduler/backend/queue/
scheduling_queue.go``) a moved pod in backoff is popped as soon as the active queue is empty, which it
always is here at such an event, so every retry happens at the event itself. A task can wait its whole
RTT away here; the wait counts in its RTT.

:meth:`PendingQueue.pop_fitting` returns the oldest task that fits somewhere now. It is exactly a scan of
the whole queue in arrival order (room only shrinks while a drain places tasks, so a task skipped once in
a drain never fits later in it), but it visits only the head of each app's queue plus, for GPU apps, the
tasks whose GPU memory exceeds what the best free GPU holds.

>>> from app.sim.view import Task
>>> q = PendingQueue()
>>> for i, app in enumerate(["gCTF", "upload", "gCTF"]):
...     q.push(Task(i, app, 50.0, 0.0, 0.0))
>>> q.begin(); q.pop_fitting({"gCTF": -1.0, "upload": float("inf")}).task_id, len(q)
('t0000001', 2)
"""

from __future__ import annotations

from collections.abc import Mapping

from app.sim.view import Task

EPS = 1e-9


class PendingQueue:
    """Per-app FIFO lists of waiting tasks (arrival order within an app is arrival order overall)."""

    def __init__(self) -> None:
        self._q: dict[str, list[Task | None]] = {}
        self._cursor: dict[str, int] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def push(self, task: Task) -> None:
        self._q.setdefault(task.app, []).append(task)
        self._n += 1

    def apps(self) -> list[str]:
        """Apps with a waiting task."""
        return [a for a, q in self._q.items() if q]

    def begin(self) -> None:
        """Start a drain: every waiting task gets a fresh try."""
        self._cursor = dict.fromkeys(self._q, 0)

    def pop_fitting(self, room: Mapping[str, float]) -> Task | None:
        """The oldest waiting task that fits: ``room[app]`` is the most GPU memory free on one usable GPU
        for a GPU app (-1: no room at all) and ``inf``/-1 for an app that needs no GPU."""
        best: tuple[int, str, int] | None = None
        for app, q in self._q.items():
            r = room.get(app, -1.0)
            if r < 0 or not q:
                continue
            pos = self._cursor.get(app, 0)
            while pos < len(q):
                t = q[pos]
                if t is not None and t.profile.gpu_mem_gb(t.input_mb) <= r + EPS:
                    break
                pos += 1
            self._cursor[app] = pos
            if pos < len(q):
                t = q[pos]
                assert t is not None
                if best is None or t.idx < best[0]:
                    best = (t.idx, app, pos)
        if best is None:
            self._compact()
            return None
        _, app, pos = best
        task = self._q[app][pos]
        self._q[app][pos] = None
        self._n -= 1
        return task

    def _compact(self) -> None:
        for app, q in self._q.items():
            if any(t is None for t in q):
                self._q[app] = [t for t in q if t is not None]

    def drop_all(self) -> list[Task]:
        """Remove and return every waiting task (at the end of a run)."""
        out = [t for q in self._q.values() for t in q if t is not None]
        self._q.clear()
        self._n = 0
        return sorted(out, key=lambda t: t.idx)
