"""GPU metrics from the dcgm-exporter and nvidia_gpu_exporter fixtures: units, aggregation, blanks, NaN."""

from __future__ import annotations

import pytest
from bridge_fixtures import (
    A100_A,
    A100_B,
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
    gpu_node,
    ok,
    raw_samples,
    raw_sum,
    two_rounds,
    with_value,
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
    assert "cpu_usage_system" in m  # CPU metrics of the same node come from node_exporter beside it


def test_a_gpu_the_exporter_skipped_drops_out_of_that_scrapes_aggregate(dcgm):
    power = by_gpu(DCGM_B, "DCGM_FI_DEV_POWER_USAGE")
    assert set(power) == {"0"}  # gpu 1's reading was blank: dcgm-exporter writes no line for it
    assert dcgm.message["metrics"]["gpu_power_w"] == pytest.approx(power["0"])
    assert dcgm.dropped == {}


def test_a_blank_sentinel_that_reaches_the_bridge_is_dropped_not_summed():
    # no stored dcgm-exporter version writes one (it skips DCGM's four blanks); the bridge drops any that come
    line = next(x for x in DCGM_B.read_text().splitlines() if x.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="1"'))
    text = with_value(DCGM_B.read_text(), line.rsplit(" ", 1)[0], 9223372036854775794)
    snap = assembler(DCGM_URL).assemble([ok(DCGM_URL, text, 0.0)], 0.0)
    assert snap.message["metrics"]["gpu_temperature"] == by_gpu(DCGM_B, "DCGM_FI_DEV_GPU_TEMP")["0"]
    assert snap.dropped == {"dcgm_exporter": 1}


def test_profiling_fields_of_a_datacenter_gpu_give_pcie_and_engine_activity():
    m = gpu_node(A100_A, A100_B).message["metrics"]
    assert m["pcie_rx_bytes"] == raw_sum(A100_B, "DCGM_FI_PROF_PCIE_RX_BYTES")
    assert m["pcie_tx_bytes"] == raw_sum(A100_B, "DCGM_FI_PROF_PCIE_TX_BYTES")
    assert m["gpu_engine_active"] == raw_sum(A100_B, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert m["gpu_dram_active"] == raw_sum(A100_B, "DCGM_FI_PROF_DRAM_ACTIVE")


def test_no_pcie_reading_on_a_geforce_dcgm_node_and_none_sneaks_in_from_elsewhere(dcgm):
    assert not {"pcie_rx_bytes", "pcie_tx_bytes", "gpu_engine_active"} & set(dcgm.message["metrics"])


def test_nvidia_gpu_exporter_units():
    snap = gpu_node(NVIDIA_A, NVIDIA_B, url=NVIDIA_URL)
    m = snap.message["metrics"]
    assert snap.message["node_class"] == "gpu" and snap.message["gpu_model"] == "Tesla K20c"
    assert m["nvidia_smi_utilization_gpu"] == 0.86
    assert m["nvidia_smi_memory_used"] == raw_sum(NVIDIA_B, "nvidia_smi_memory_used_bytes")
    assert m["gpu_memory_total_bytes"] == 4799 * MIB
    assert m["gpu_memory_used_fraction"] == pytest.approx(
        raw_sum(NVIDIA_B, "nvidia_smi_memory_used_bytes") / raw_sum(NVIDIA_B, "nvidia_smi_memory_total_bytes"))
    assert m["gpu_sm_clock_mhz"] == pytest.approx(758.0)
    assert m["gpu_memory_copy_util"] == 0.44
    assert "pcie_rx_bytes" not in m  # nvidia_gpu_exporter 1.2.1 has no PCIe throughput
    assert snap.message["stale"] == []


def test_a_nan_reading_is_dropped_and_counted():
    series = next(x for x in NVIDIA_B.read_text().splitlines() if x.startswith("nvidia_smi_power_draw_watts"))
    text = with_value(NVIDIA_B.read_text(), series.rsplit(" ", 1)[0], "NaN")
    snap = assembler(NVIDIA_URL).assemble([ok(NVIDIA_URL, text, 0.0)], 0.0)
    assert "gpu_power_w" not in snap.message["metrics"]
    assert snap.dropped == {"nvidia_gpu_exporter": 1}


def test_an_out_of_range_utilisation_glitch_is_rejected_per_gpu_and_counted():
    line = [x for x in DCGM_B.read_text().splitlines() if x.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="1"')][0]
    glitch = with_value(DCGM_B.read_text(), line.rsplit(" ", 1)[0], 808334905)
    snap = assembler(DCGM_URL).assemble([ok(DCGM_URL, glitch, 0.0)], 0.0)
    assert snap.message["metrics"]["nvidia_smi_utilization_gpu"] == 0.99  # gpu 0 alone
    assert snap.rejected == {"nvidia_smi_utilization_gpu": 1} and snap.clamped == {}
