"""GPU metrics from the dcgm-exporter and nvidia_gpu_exporter captures: units, aggregation, blanks, NaN."""

from __future__ import annotations

import pytest
from bridgekit import (
    DCGM_A,
    DCGM_B,
    DCGM_URL,
    GAP_S,
    NODE_A,
    NODE_B,
    NODE_URL,
    NVIDIA_A,
    NVIDIA_B,
    NVIDIA_URL,
    assembler,
    ok,
    raw_samples,
    raw_sum,
    two_rounds,
)

MIB = 1024 * 1024


def by_gpu(path, name):
    return {labels["gpu"]: v for labels, v in raw_samples(path, name)}


@pytest.fixture
def dcgm():
    a = assembler(NODE_URL, DCGM_URL)
    return two_rounds(a, [ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, DCGM_A, 0.0)],
                      [ok(NODE_URL, NODE_B, GAP_S), ok(DCGM_URL, DCGM_B, GAP_S)])


def test_dcgm_node_is_a_gpu_node_with_the_model_of_its_label(dcgm):
    assert dcgm.message["node_class"] == "gpu"
    assert dcgm.message["gpu_model"] == "NVIDIA GeForce RTX 4090"
    assert dcgm.message["stale"] == []
    assert dcgm.message["metrics"]["gpu_count"] == 2


def test_utilisation_is_the_mean_fraction_and_memory_the_sum_in_bytes(dcgm):
    m = dcgm.message["metrics"]
    util = by_gpu(DCGM_B, "DCGM_FI_DEV_GPU_UTIL")
    assert m["nvidia_smi_utilization_gpu"] == pytest.approx((util["0"] + util["1"]) / 2 / 100, abs=1e-12)
    assert m["nvidia_smi_memory_used"] == raw_sum(DCGM_B, "DCGM_FI_DEV_FB_USED") * MIB
    assert m["gpu_temperature"] == max(by_gpu(DCGM_B, "DCGM_FI_DEV_GPU_TEMP").values())
    assert m["gpu_power_w"] == pytest.approx(raw_sum(DCGM_B, "DCGM_FI_DEV_POWER_USAGE"), abs=1e-9)
    # CPU metrics of the same node come from node_exporter beside it
    assert "cpu_usage_system" in m


def test_dcgm_blank_sentinel_is_dropped_not_summed(dcgm):
    rx = by_gpu(DCGM_B, "DCGM_FI_PROF_PCIE_RX_BYTES")
    assert rx["1"] >= 9.22e18  # the capture carries DCGM's int64 blank for gpu 1
    assert dcgm.message["metrics"]["pcie_rx_bytes"] == rx["0"]
    assert dcgm.dropped == {"dcgm_exporter": 1}


def test_pcie_kb_counter_becomes_bytes_per_second_when_profiling_metrics_are_absent():
    def no_prof(path):
        return "\n".join(line for line in path.read_text().splitlines() if "DCGM_FI_PROF_" not in line) + "\n"

    a = assembler(DCGM_URL)
    snap = two_rounds(a, [ok(DCGM_URL, no_prof(DCGM_A), 0.0)], [ok(DCGM_URL, no_prof(DCGM_B), GAP_S)])
    kb = {g: by_gpu(DCGM_B, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT")[g] - by_gpu(DCGM_A, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT")[g]
          for g in ("0", "1")}
    expected = (kb["0"] + kb["1"]) * 1024 / GAP_S
    assert snap.message["metrics"]["pcie_rx_bytes"] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx((5_250_000 + 3_950_000) * 1024, rel=1e-9)  # the capture's intended rates


def test_pcie_counter_source_claims_the_metric_even_before_it_has_a_rate():
    a = assembler(DCGM_URL)
    text = "\n".join(line for line in DCGM_A.read_text().splitlines() if "DCGM_FI_PROF_PCIE" not in line)
    snap = a.assemble([ok(DCGM_URL, text, 0.0)], 0.0)
    assert "pcie_rx_bytes" not in snap.message["metrics"]  # no nvidia-exporter value sneaks in either


def test_nvidia_gpu_exporter_units_and_nan_dropped():
    a = assembler(NVIDIA_URL)
    snap = two_rounds(a, [ok(NVIDIA_URL, NVIDIA_A, 0.0)], [ok(NVIDIA_URL, NVIDIA_B, GAP_S)])
    m = snap.message["metrics"]
    assert snap.message["node_class"] == "gpu" and snap.message["gpu_model"] == "Tesla K20c"
    assert m["nvidia_smi_utilization_gpu"] == 0.86
    assert m["nvidia_smi_memory_used"] == raw_sum(NVIDIA_B, "nvidia_smi_memory_used_bytes")
    assert m["gpu_memory_used_fraction"] == pytest.approx(
        raw_sum(NVIDIA_B, "nvidia_smi_memory_used_bytes") / raw_sum(NVIDIA_B, "nvidia_smi_memory_total_bytes"))
    assert m["gpu_sm_clock_mhz"] == pytest.approx(758.0)
    assert m["pcie_rx_bytes"] == raw_sum(NVIDIA_B, "nvidia_smi_pcie_throughput_rx_bytes_per_second")
    assert "gpu_power_w" not in m  # NaN in the capture
    assert snap.dropped == {"nvidia_gpu_exporter": 1}
    assert snap.message["stale"] == []


def test_an_out_of_range_utilisation_glitch_is_dropped_per_gpu():
    line = [x for x in DCGM_B.read_text().splitlines() if x.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="1"')][0]
    glitch = DCGM_B.read_text().replace(line, line.rsplit(" ", 1)[0] + " 808334905")
    assert glitch != DCGM_B.read_text()
    snap = assembler(DCGM_URL).assemble([ok(DCGM_URL, glitch, 0.0)], 0.0)
    assert snap.message["metrics"]["nvidia_smi_utilization_gpu"] == 0.99  # gpu 0 alone
