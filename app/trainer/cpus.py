"""CPU pinning of the trainer, so training never competes with the worker and the extender for their cores.

``RTT_TRAINER_CPUS`` takes the CPU list syntax of taskset and cgroups.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable

from app.errors import ConfigError

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


def format_cpus(cpus: Iterable[int]) -> str:
    """CPUs in the CPU list syntax, ranges folded.

    >>> format_cpus({0, 1, 2, 5, 7, 8})
    '0-2,5,7-8'
    """
    out: list[str] = []
    for cpu in sorted(set(cpus)):
        if out and cpu == int(out[-1].rpartition("-")[2]) + 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def pin_cpus(cpus: Iterable[int], field: str = "RTT_TRAINER_CPUS") -> None:
    """Pin this process (every thread, the training thread included) to ``cpus``.

    A CPU this process may not run on (it does not exist, or a cgroup/cpuset leaves it out) raises
    :class:`~app.errors.ConfigError` naming ``field`` and the CPUs there are.
    """
    wanted = set(cpus)
    there = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, wanted)
    except OSError as exc:  # EINVAL: none of them is usable
        reason = "not available here" if exc.errno == errno.EINVAL else exc.strerror or str(exc)
        raise ConfigError(field, f"cannot pin to CPUs {format_cpus(wanted)}: {reason} (this process may use"
                                 f" CPUs {format_cpus(there)})") from None
    got = os.sched_getaffinity(0)
    if got != wanted:  # some were usable: the kernel pinned to those and dropped the others
        os.sched_setaffinity(0, there)
        raise ConfigError(field, f"cannot pin to CPUs {format_cpus(wanted)}: {format_cpus(wanted - got)} not"
                                 f" available here (this process may use CPUs {format_cpus(there)})")
    log.info("trainer pinned to CPUs %s", sorted(wanted))
