"""Bounded exploration: send some pods of an app to a node whose RTT for it has not been learnt yet.

A scheduler that only exploits its models never learns the nodes it has no model for: a CPU node
that has no ``upload:cpu`` model scores neutral against GPU nodes that do, so it never runs an upload,
never produces a sample, and its model never reaches the cold-start count; a node that joins has no
samples of its own, so its residual correction cannot start. For a pod of ``app``, a candidate is
*not yet learnt* when

* no model covers it for ``app`` (no ``app:class`` model: a cold start), or
* node-weights says it has completed fewer than ``min_samples`` tasks of ``app`` (0 by default: off),

and nothing is explored while no model of ``app`` covers any candidate: the scores are neutral then, so
kube-scheduler's own placements sample the nodes anyway, and an explored pod would only swap a balanced
placement for an arbitrary one (measured on the large preset: +13 % mean RTT over the first 40 % of the
run, before the first models).

Bounds: only a ``share`` of each app's pods may explore — chosen by a hash of the pod's uid, so the
choice is the same on every replica and in every replay — and a node explores one pod of an app at a
time (a candidate with an assumed, not yet finished pod of ``app`` is skipped). The node with the
fewest samples wins (ties by the hash of uid and node). Its cost is measured by the simulator
(``bench/bench_learning.py``: exploration off against on).

The cold start is what exploration is for: each (app, node class) needs its first samples before any model
can cover it. A covered node with few samples of its own already has the class model's prediction, which
knows its hardware; exploring it only starts its residual correction sooner, and each such pod goes where
the model expects it to run slower. On the large preset (300 nodes, 20,000 tasks, seeds 1-2 of
``bench/bench_learning.py --preset large --tasks 20000``) ``min_samples: 3`` explored 11 % of the pods,
which ran 164 ms on their node against 94 ms on average: mean RTT 94.1 ms, against 86.3 with the default 0
(2 % of the pods explored) and 84.5 with no exploration at all. On the small preset's scenarios the
difference is within the seeds' noise (docs/simulator.md). An operator whose nodes of one class differ in
ways the hardware features do not show can raise it.

>>> import numpy as np
>>> unlearnt = not_learnt(np.array([True, True]), covered=np.array([True, False]), samples=np.array([50, 1]),
...                       in_flight=np.array([0, 0]), min_samples=3)
>>> unlearnt.tolist(), explored("uid-7", ["g", "c"], unlearnt, np.array([50, 1]), share=1.0)
([False, True], 1)
>>> explored("uid-7", ["g", "c"], unlearnt, np.array([50, 1]), share=0.0) is None
True
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

_SCALE = float(2**32)


def chosen_to_explore(task_id: str, share: float) -> bool:
    """Whether a pod is one of the ``share`` that may explore (a stable hash of its uid).

    >>> sum(chosen_to_explore(f"pod-{i}", 0.25) for i in range(4000)) / 4000
    0.24875
    """
    if share <= 0.0:
        return False
    return share >= 1.0 or zlib.crc32(task_id.encode()) / _SCALE < share


def not_learnt(eligible: np.ndarray, covered: np.ndarray, samples: np.ndarray, in_flight: np.ndarray,
               min_samples: int) -> np.ndarray:
    """Per candidate: may run the pod, is not yet learnt for the app, and runs no pod of it now.

    Parameters
    ----------
    eligible
        Fresh data and not filtered out.
    covered
        Some model of the app covers the node (none anywhere: no candidate is returned).
    samples
        Completed tasks of the app on the node (node-weights ``samples``).
    in_flight
        Pods of the app the scheduler counts as running there.
    """
    if not covered.any():  # no model of the app here yet: nothing is learnt, nothing to steer towards
        return np.zeros(eligible.shape, dtype=bool)
    return eligible & (~covered | (samples < min_samples)) & (in_flight == 0)


def explored(task_id: str, nodes: Sequence[str], unlearnt: np.ndarray, samples: np.ndarray, *,
             share: float) -> int | None:
    """Index in ``nodes`` of the candidate this pod explores (fewest samples, ties by the hash of uid and
    node), or None to place it by the models."""
    if not unlearnt.any() or not chosen_to_explore(task_id, share):
        return None
    idx = np.flatnonzero(unlearnt)
    fewest = idx[samples[idx] == samples[idx].min()]
    return int(min(fewest, key=lambda i: zlib.crc32(f"{task_id}|{nodes[i]}".encode())))
