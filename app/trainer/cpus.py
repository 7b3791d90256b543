"""CPU pinning of the trainer, so training never competes with the worker and the extender for their cores.

``RTT_TRAINER_CPUS`` takes the CPU list syntax of taskset and cgroups.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger(__name__)


def parse_cpus(spec: str) -> set[int]:
    """CPU list syntax of taskset/cgroups: ``"2-3"``, ``"0,2,4-5"``.

    >>> sorted(parse_cpus("0,2,4-5"))
    [0, 2, 4, 5]
    """
    cpus: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"bad CPU list {spec!r}") from None
        if a < 0 or b < a:
            raise ValueError(f"bad CPU range {part!r} in {spec!r}")
        cpus.update(range(a, b + 1))
    if not cpus:
        raise ValueError(f"empty CPU list {spec!r}")
    return cpus


def pin_cpus(cpus: Iterable[int]) -> None:
    """Pin this process (every thread, the training thread included) to ``cpus``."""
    wanted = set(cpus)
    os.sched_setaffinity(0, wanted)
    log.info("trainer pinned to CPUs %s", sorted(wanted))
