"""A closed-loop workload: ``clients`` users, each submitting its next task a think time after its previous
one completed (or was found unschedulable), until ``duration_s``.

Throughput then follows the placement: faster tasks let every client submit more. Task attributes (app,
input size, noise draw, think time) are drawn in fixed-size chunks in submission order, so every policy of
a seed sees the same i-th task; a policy that completes more tasks simply reads further.

>>> import numpy as np
>>> w = ClosedLoop(np.random.default_rng(1), clients=4, think_s=0.5, duration_s=60.0)
>>> w2 = ClosedLoop(np.random.default_rng(1), clients=4, think_s=0.5, duration_s=60.0)
>>> w.task(5000) == w2.task(5000), w.task(3)[0] in ("upload", "gCTF", "Motioncor2")
(True, True)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from app.sim.workload import DEFAULT_MIX, check_mix, draw_tasks

CHUNK = 4096


class ClosedLoop:
    """``clients`` users with exponential think times of mean ``think_s``; nothing is submitted after
    ``duration_s``. The first task of each client arrives after one think time."""

    def __init__(self, rng: np.random.Generator, clients: int, think_s: float, duration_s: float,
                 mix: Mapping[str, float] | None = None) -> None:
        if clients < 1:
            raise ValueError(f"workload.clients: must be >= 1 (got {clients})")
        if not think_s >= 0:
            raise ValueError(f"workload.think_s: must be >= 0 (got {think_s})")
        if not duration_s > 0:
            raise ValueError(f"workload.duration_s: must be > 0 (got {duration_s})")
        self.mix = dict(mix or DEFAULT_MIX)
        check_mix(self.mix)
        self.clients = clients
        self.think_s = think_s
        self.duration_s = float(duration_s)
        self._rng = rng
        self._apps: list[str] = []
        self._mb: list[float] = []
        self._z: list[float] = []
        self._think: list[float] = []
        self.first_think = [self._draw_think() for _ in range(clients)]

    def _draw_think(self) -> float:
        return float(self._rng.exponential(self.think_s)) if self.think_s > 0 else 0.0

    def _grow(self, upto: int) -> None:
        while len(self._apps) <= upto:
            apps, mb, z = draw_tasks(self._rng, CHUNK, self.mix)
            think = self._rng.exponential(self.think_s, CHUNK) if self.think_s > 0 else np.zeros(CHUNK)
            self._apps.extend(apps)
            self._mb.extend(mb.tolist())
            self._z.extend(z.tolist())
            self._think.extend(think.tolist())

    def task(self, i: int) -> tuple[str, float, float, float]:
        """The i-th submitted task: (app, input MB, noise draw, think time after it completes)."""
        self._grow(i)
        return self._apps[i], self._mb[i], self._z[i], self._think[i]
