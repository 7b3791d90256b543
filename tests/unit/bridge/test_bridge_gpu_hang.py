"""The GPU hang check with stock exporters: flat zeros while pods (running-pods view) or processes are on the GPU."""

from __future__ import annotations

import math

import pytest
from bridge_fixtures import DCGM_B, DCGM_URL, DCGM_WATCHDOG, NVIDIA_HUNG, NVIDIA_URL, assembler, ok, raw_sum, with_value

from app.bridge.mapping import load_mapping

GPU_METRICS = {m.name for m in load_mapping().metrics if m.group == "gpu"}
FLAT_S = load_mapping().watchdog.flat_for_s


def rounds(url, texts_and_pods, start=1000.0, step=5.0):
    a = assembler(url)
    return [a.assemble([ok(url, text, start + i * step)], start + i * step, pods)
            for i, (text, pods) in enumerate(texts_and_pods)]


def kinds(snap):
    return [t.kind for t in snap.troubles]


def test_flat_zeros_while_pods_of_gpu_apps_run_are_a_hang_once_they_last():
    # stock dcgm-exporter, no custom gauge: only the running-pods view says work is on the GPU
    n = math.ceil(FLAT_S / 5)  # rounds 5 s apart: the n-th is the first FLAT_S after the first
    snaps = rounds(DCGM_URL, [(DCGM_WATCHDOG, 2)] * (n + 1))
    assert all(kinds(s) == [] for s in snaps[:n])
    assert kinds(snaps[n]) == ["gpu_hang"]
    assert "gpu" in snaps[n].message["stale"] and not GPU_METRICS & set(snaps[n].message["metrics"])
    # a GPU exporter was this node's only endpoint: nothing is left, so every group of the node is stale
    assert snaps[n].message["metrics"] == {} and snaps[n].message["stale"] == ["cpu", "gpu", "memory", "node"]
    assert "2 pod(s) of GPU apps" in snaps[n].troubles[0].detail
    # the first flat readings were published: a task may be between GPU phases
    assert snaps[0].message["metrics"]["nvidia_smi_utilization_gpu"] == 0.0


def test_no_pod_and_no_process_is_an_idle_gpu():
    snaps = rounds(DCGM_URL, [(DCGM_WATCHDOG, 0)] * 10)
    assert all(s.troubles == () for s in snaps)
    snaps = rounds(DCGM_URL, [(DCGM_WATCHDOG, None)] * 10)  # no running-pods view at all
    assert all(s.troubles == () for s in snaps)


def test_work_resuming_resets_the_clock():
    n = int(FLAT_S // 5)
    seq = [(DCGM_WATCHDOG, 1)] * n + [(DCGM_B, 1)] + [(DCGM_WATCHDOG, 1)] * n
    assert all(kinds(s) == [] for s in rounds(DCGM_URL, seq))


def test_processes_on_a_gpu_that_reads_idle_are_a_hang_without_any_view():
    # nvidia_gpu_exporter >= 1.9.0 with --collect.compute-apps counts processes holding a context
    assert raw_sum(NVIDIA_HUNG, "nvidia_smi_compute_apps") == 2
    n = math.ceil(FLAT_S / 5)  # rounds 5 s apart: the n-th is the first FLAT_S after the first
    snaps = rounds(NVIDIA_URL, [(NVIDIA_HUNG, None)] * (n + 1))
    assert kinds(snaps[n - 1]) == [] and kinds(snaps[n]) == ["gpu_hang"]
    assert "gpu_compute_processes = 2" in snaps[n].troubles[0].detail
    assert snaps[0].message["metrics"]["gpu_compute_processes"] == 2.0


def test_processes_on_a_gpu_without_memory_in_use_are_a_watchdog_reset_at_once():
    text = NVIDIA_HUNG.read_text()
    series = next(x for x in text.splitlines() if x.startswith("nvidia_smi_memory_used_bytes"))
    [snap] = rounds(NVIDIA_URL, [(with_value(text, series.rsplit(" ", 1)[0], 0), None)])
    assert kinds(snap) == ["watchdog_reset"] and snap.troubles[0].groups == ("gpu",)
    assert snap.message["metrics"] == {} and snap.message["stale"] == ["cpu", "gpu", "memory", "node"]


@pytest.mark.parametrize("flat_for_s", [0.0, 12.5])
def test_the_flat_period_comes_from_the_mapping(tmp_path, flat_for_s):
    import yaml

    from app.bridge.mapping import DEFAULT_PATH, load_mapping
    from app.bridge.snapshot import NodeAssembler
    from app.bridge.targets import Endpoint, Target

    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    doc["watchdog"]["flat_for_s"] = flat_for_s
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    a = NodeAssembler(Target("n", (Endpoint(DCGM_URL),)), load_mapping(path))
    first = a.assemble([ok(DCGM_URL, DCGM_WATCHDOG, 0.0)], 100.0, 1)
    later = a.assemble([ok(DCGM_URL, DCGM_WATCHDOG, 12.5)], 112.5, 1)
    assert kinds(first) == (["gpu_hang"] if flat_for_s == 0 else [])
    assert kinds(later) == ["gpu_hang"]
