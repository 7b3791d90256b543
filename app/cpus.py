"""How many CPUs this process may use: its affinity, and the container's CPU quota (cgroup v2 or v1).

``os.sched_getaffinity`` lists the CPUs the scheduler may run the process on, and ignores a CPU quota: a
container limited to 2 CPUs on a 64-core node (Kubernetes' default CPU manager policy, ``none``) sees 64.
Thread pools sized from it (XGBoost's OpenMP threads, the feature vote's MIC threads) then run 64 threads
in 2 CPUs of time, each stalled most of each period: a training that takes 0.4 s takes seconds.
:func:`usable_cpus` takes the smaller of the two, the quota rounded up.

>>> quota_cpus("200000 100000"), quota_cpus("150000 100000"), quota_cpus("max 100000"), quota_cpus("bad")
(2.0, 1.5, None, None)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CPU_NUMBER_MAX = 65_535  # above any machine's CPU numbers: a list up to it is parsed in no time


def quota_cpus(cpu_max: str) -> float | None:
    """CPUs of a cgroup v2 ``cpu.max`` line (``"<quota> <period>"``); None for no quota or a line not understood."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpus(root: Path | None = None) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``) under ``root`` (default :data:`CGROUP`); None when there is none or it cannot be read."""
    root = CGROUP if root is None else root
    try:
        return quota_cpus((root / "cpu.max").read_text())
    except OSError:
        pass
    try:
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return quota_cpus(f"{quota} {period}") if quota != "-1" else None


def usable_cpus(root: Path | None = None) -> int:
    """The CPUs this process may use: its affinity's count, at most its cgroup's quota rounded up (at least 1)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        allowed = os.cpu_count() or 1
    quota = cgroup_cpus(root)
    if quota is not None:
        allowed = min(allowed, math.ceil(quota))
    return max(1, allowed)


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
        if b > CPU_NUMBER_MAX:  # a range to a billion would take minutes and gigabytes to build
            raise ValueError(f"CPU {b} in {spec!r} is above any machine's (at most {CPU_NUMBER_MAX})")
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
