"""CPU pinning of the trainer, so training never competes with the worker and the extender for their cores.

``RTT_TRAINER_CPUS`` takes the CPU list syntax of taskset and cgroups.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable

from app.cpus import format_cpus, parse_cpus
from app.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["format_cpus", "parse_cpus", "pin_cpus"]


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
