"""The CPUs a process may use: a container's CPU quota bounds its thread pools, not only its affinity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app import cpus
from app.cpus import cgroup_cpus, usable_cpus
from app.model import train


def cgroup(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    return tmp_path


def test_the_quota_of_cgroup_v2_and_v1(tmp_path: Path) -> None:
    assert cgroup_cpus(cgroup(tmp_path / "a", v2="200000 100000")) == 2.0
    assert cgroup_cpus(cgroup(tmp_path / "b", v2="max 100000")) is None
    assert cgroup_cpus(cgroup(tmp_path / "c", v1=("50000", "100000"))) == 0.5
    assert cgroup_cpus(cgroup(tmp_path / "d", v1=("-1", "100000"))) is None
    assert cgroup_cpus(tmp_path / "none") is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_a_quota_below_the_affinity_bounds_the_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-CPU limit on a 64-core node (Kubernetes' default CPU manager policy): 2 threads, not 63."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    root = cgroup(tmp_path, v2="200000 100000")
    assert usable_cpus(root) == 2
    assert usable_cpus(cgroup(tmp_path / "frac", v2="150000 100000")) == 2  # 1.5 CPUs of time: 2 threads
    assert usable_cpus(tmp_path / "no-quota") == 64
    monkeypatch.setattr(cpus, "CGROUP", root)
    assert train.default_nthread() == 2
    monkeypatch.setattr(cpus, "CGROUP", tmp_path / "no-quota")
    assert train.default_nthread() == 63  # every CPU of the machine: one left to the rest
