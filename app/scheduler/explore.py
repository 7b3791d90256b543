"""Bounded exploration: send some pods of an app to a node whose RTT for it has not been learnt yet.

A scheduler that only exploits its models never learns the nodes it has no model for: a CPU node
that has no ``upload:cpu`` model scores neutral against GPU nodes that do, so it never runs an upload,
never produces a sample, and its model never reaches the cold-start count; a node that joins has no
samples of its own, so its residual correction cannot start. For a pod of ``app``, a candidate is
*not yet learnt* when

* no model covers it for ``app`` (no ``app:class`` model: a cold start), or
* node-weights says it has completed fewer than ``min_samples`` tasks of ``app``.

Bounds: only a ``share`` of each app's pods may explore — chosen by a hash of the pod's uid, so the
choice is the same on every replica and in every replay — and a node explores one pod of an app at a
time (a candidate with an assumed, not yet finished pod of ``app`` is skipped). The node with the
fewest samples wins (ties by the hash of uid and node). Its cost is measured by the simulator
(``bench/bench_learning.py``: exploration off against on).

>>> from types import MappingProxyType as M
>>> from app.scheduler.snapshot import NodeState
>>> states = {"g": NodeState("g", samples=M({"upload": 50})), "c": NodeState("c", samples=M({"upload": 1}))}
>>> explored("uid-7", "upload", ["g", "c"], [True, True], states, {"g"}, lambda i: 0, share=1.0, min_samples=3)
1
>>> explored("uid-7", "upload", ["g", "c"], [True, True], states, {"g"}, lambda i: 1, share=1.0, min_samples=3) is None
True
>>> explored("uid-7", "upload", ["g", "c"], [True, True], states, {"g"}, lambda i: 0, share=0.0, min_samples=3) is None
True
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Mapping, Sequence

from app.scheduler.snapshot import NodeState

_SCALE = float(2**32)


def chosen_to_explore(task_id: str, share: float) -> bool:
    """Whether a pod is one of the ``share`` that may explore (a stable hash of its uid).

    >>> sum(chosen_to_explore(f"pod-{i}", 0.25) for i in range(4000)) / 4000
    0.24875
    """
    if share <= 0.0:
        return False
    return share >= 1.0 or zlib.crc32(task_id.encode()) / _SCALE < share


def explored(task_id: str, app: str, nodes: Sequence[str], eligible: Sequence[bool], states: Mapping[str, NodeState],
             covered: Collection[str], in_flight: Callable[[int], int], *, share: float,
             min_samples: int) -> int | None:
    """Index in ``nodes`` of the candidate this pod explores, or None to place it by the models.

    Parameters
    ----------
    eligible
        Per candidate: it may run the pod (fresh data, not filtered out).
    covered
        Candidates some model of ``app`` covers.
    in_flight
        ``i ->`` pods of ``app`` the scheduler placed on ``nodes[i]`` that are not expected to have finished.
    """
    if not chosen_to_explore(task_id, share):
        return None
    best: tuple[int, int] | None = None
    best_i: int | None = None
    for i, name in enumerate(nodes):
        if not eligible[i]:
            continue
        st = states.get(name)
        seen = st.samples.get(app, 0) if st is not None else 0
        if name in covered and seen >= min_samples:
            continue
        if in_flight(i):
            continue
        rank = (seen, zlib.crc32(f"{task_id}|{name}".encode()))
        if best is None or rank < best:
            best, best_i = rank, i
    return best_i
