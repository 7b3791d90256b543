"""Canonical CPU, memory, disk metrics from the two real node_exporter 1.5.0 captures."""

from __future__ import annotations

import pytest
from bridge_fixtures import NODE_A, NODE_B, NODE_URL, assembler, ok, raw_samples, raw_sum, with_value

MODES = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")


def delta(name: str, **labels: str) -> float:
    return raw_sum(NODE_B, name, **labels) - raw_sum(NODE_A, name, **labels)


def cpu_share(mode: str) -> float:
    """Δmode / Δall-modes, summed over CPUs, from the raw text."""
    return delta("node_cpu_seconds_total", mode=mode) / sum(delta("node_cpu_seconds_total", mode=m) for m in MODES)


def node_dt() -> float:
    return raw_sum(NODE_B, "node_time_seconds") - raw_sum(NODE_A, "node_time_seconds")


@pytest.fixture
def second():
    a = assembler(NODE_URL)
    first = a.assemble([ok(NODE_URL, NODE_A, 0.0)], 1000.0)
    return first, a.assemble([ok(NODE_URL, NODE_B, 8.4)], 1008.4)


def test_the_two_captures_are_8_4_seconds_apart_on_the_node_clock():
    assert node_dt() == pytest.approx(8.4, abs=0.01)
    # every CPU accrued the same time in all its modes
    for cpu in ("0", "1"):
        assert sum(delta("node_cpu_seconds_total", cpu=cpu, mode=m) for m in MODES) == pytest.approx(8.4, abs=0.05)


@pytest.mark.parametrize(("canonical", "mode"), [("cpu_iowait", "iowait"), ("cpu_usage_system", "system"),
                                                 ("cpu_usage_user", "user"), ("cpu_idle", "idle"),
                                                 ("cpu_steal", "steal"), ("cpu_usage_nice", "nice")])
def test_cpu_fractions_are_mode_share_of_all_cpu_time_summed_over_cpus(second, canonical, mode):
    _, snap = second
    assert snap.message["metrics"][canonical] == pytest.approx(cpu_share(mode), abs=1e-9)


def test_cpu_system_is_not_trivially_zero(second):
    _, snap = second
    # cpu0 accrued 8.39 s, cpu1 8.42 s; system time grew 0.04 s on each
    assert snap.message["metrics"]["cpu_usage_system"] == pytest.approx(0.08 / 16.81, rel=1e-6)
    assert sum(snap.message["metrics"][k] for k in SHARES) == pytest.approx(1.0, abs=1e-9)


SHARES = ("cpu_idle", "cpu_iowait", "cpu_usage_system", "cpu_usage_user", "cpu_usage_nice", "cpu_steal", "cpu_irq")


def test_the_cpu_shares_sum_to_one_with_nice_time_in_them():
    # the captures accrued no nice time: give cpu1 0.5 s of it (and its clock as much more time)
    a = assembler(NODE_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0)], 0.0)
    nice1 = 'node_cpu_seconds_total{cpu="1",mode="nice"}'
    text = with_value(NODE_B.read_text(), nice1, raw_sum(NODE_B, "node_cpu_seconds_total", cpu="1", mode="nice") + 0.5)
    m = a.assemble([ok(NODE_URL, text, 8.4)], 1.0).message["metrics"]
    assert m["cpu_usage_nice"] == pytest.approx(0.5 / (16.81 + 0.5), rel=1e-3)
    assert sum(m[k] for k in SHARES) == pytest.approx(1.0, abs=1e-12)


def test_memory_metrics_are_the_second_captures_gauges(second):
    _, snap = second
    m = snap.message["metrics"]
    total = raw_sum(NODE_B, "node_memory_MemTotal_bytes")
    assert m["memory_cache_usage"] == pytest.approx(raw_sum(NODE_B, "node_memory_Cached_bytes") / total, abs=1e-12)
    assert m["memory_cached_bytes"] == raw_sum(NODE_B, "node_memory_Cached_bytes")
    assert m["memory_used_fraction"] == pytest.approx(
        1 - raw_sum(NODE_B, "node_memory_MemAvailable_bytes") / total, abs=1e-12)
    assert m["load1"] == raw_sum(NODE_B, "node_load1")
    assert m["cpu_count"] == 2


def test_byte_counters_become_rates_over_the_exporters_clock(second):
    _, snap = second
    m = snap.message["metrics"]
    assert m["disk_read_bytes_per_s"] == pytest.approx(
        delta("node_disk_read_bytes_total", device="vda") / node_dt(), rel=1e-9)
    assert m["disk_written_bytes_per_s"] == pytest.approx(
        delta("node_disk_written_bytes_total", device="vda") / node_dt(), rel=1e-9)
    assert m["network_rx_bytes_per_s"] == 0.0  # eth0 did not move between the captures; ifb* are excluded


def test_disk_iops_latency_queue_and_network_errors_from_the_raw_text(second):
    _, snap = second
    m = snap.message["metrics"]
    reads, writes = delta("node_disk_reads_completed_total", device="vda"), delta(
        "node_disk_writes_completed_total", device="vda")
    assert writes > 0  # the captures saw writes on vda
    assert m["disk_reads_per_s"] == pytest.approx(reads / node_dt(), rel=1e-9)
    assert m["disk_writes_per_s"] == pytest.approx(writes / node_dt(), rel=1e-9)
    assert m["disk_write_latency_s"] == pytest.approx(
        delta("node_disk_write_time_seconds_total", device="vda") / writes, rel=1e-9)
    assert ("disk_read_latency_s" in m) == (reads > 0)
    assert m["disk_queue_depth"] == pytest.approx(
        delta("node_disk_io_time_weighted_seconds_total", device="vda") / node_dt(), rel=1e-9)
    for canonical, raw in (("network_rx_errors_per_s", "node_network_receive_errs_total"),
                           ("network_tx_drops_per_s", "node_network_transmit_drop_total")):
        assert m[canonical] == pytest.approx(delta(raw, device="eth0") / node_dt(), abs=1e-12)
    retrans, sent = delta("node_netstat_Tcp_RetransSegs"), delta("node_netstat_Tcp_OutSegs")
    assert m["tcp_retransmits_per_s"] == pytest.approx(retrans / node_dt(), abs=1e-12)
    assert ("tcp_retransmit_fraction" in m) == (sent > 0)
    assert m["memory_pressure_stalled"] == pytest.approx(
        delta("node_pressure_memory_stalled_seconds_total") / node_dt(), abs=1e-12)
    assert m["io_pressure_stalled"] == pytest.approx(
        delta("node_pressure_io_stalled_seconds_total") / node_dt(), abs=1e-12)
    assert "cpu_frequency_mhz" not in m  # this VM's node_exporter has no cpufreq series


def test_cpu_frequency_and_its_fraction_of_the_maximum():
    freq = "".join(f'node_cpu_scaling_frequency_hertz{{cpu="{c}"}} {f}\n'
                   f'node_cpu_scaling_frequency_max_hertz{{cpu="{c}"}} 3.5e+09\n'
                   for c, f in (("0", 1.75e9), ("1", 3.5e9)))
    m = assembler(NODE_URL).assemble([ok(NODE_URL, NODE_A.read_text() + freq, 0.0)], 0.0).message["metrics"]
    assert m["cpu_frequency_mhz"] == pytest.approx(2625.0)
    assert m["cpu_frequency_fraction"] == pytest.approx(0.75)


def test_the_first_scrape_has_gauges_but_no_rates(second):
    first, _ = second
    m = first.message["metrics"]
    assert "memory_cache_usage" in m and "load1" in m
    assert not {"cpu_iowait", "cpu_usage_system", "disk_read_bytes_per_s", "disk_write_latency_s"} & set(m)
    assert first.message["node_class"] == "cpu" and first.message["gpu_model"] is None
    assert first.message["stale"] == []


def _advance_clock(text: str, seconds: float) -> str:
    t = raw_samples(NODE_B, "node_time_seconds")[0][1]
    return with_value(text, "node_time_seconds", t + seconds)


def test_a_counter_reset_skips_that_interval_and_recovers_on_the_next():
    user0 = 'node_cpu_seconds_total{cpu="0",mode="user"}'
    a = assembler(NODE_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0)], 0.0)
    reset = with_value(NODE_B.read_text(), user0, 1.0)  # the node restarted: user time starts over
    snap = a.assemble([ok(NODE_URL, reset, 8.4)], 1.0)
    assert not {"cpu_usage_user", "cpu_iowait", "cpu_usage_system"} & set(snap.message["metrics"])
    assert "disk_read_bytes_per_s" in snap.message["metrics"]  # other counters are unaffected
    after = _advance_clock(with_value(NODE_B.read_text(), user0, 1.5), 5.0)
    snap = a.assemble([ok(NODE_URL, after, 13.4)], 2.0)  # the bridge 5 s later too
    assert snap.message["metrics"]["cpu_usage_user"] == 1.0  # only cpu0's user time moved since the reset


def test_rates_fall_back_to_the_bridge_clock_when_the_exporter_sends_none():
    a = assembler(NODE_URL)

    def strip(path):
        return "".join(line + "\n" for line in path.read_text().splitlines() if "node_time_seconds" not in line)

    a.assemble([ok(NODE_URL, strip(NODE_A), 100.0)], 0.0)
    snap = a.assemble([ok(NODE_URL, strip(NODE_B), 102.0)], 2.0)
    assert snap.message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(
        delta("node_disk_read_bytes_total", device="vda") / 2.0, rel=1e-9)


def test_a_node_clock_that_jumps_gives_that_round_no_rates_and_the_next_round_its_rates():
    a = assembler(NODE_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0)], 0.0)
    jumped = _advance_clock(NODE_B.read_text(), 1e7)  # the node's clock set ahead: 8.4 s read as ~116 days
    snap = a.assemble([ok(NODE_URL, jumped, 8.4)], 8.4)
    assert "disk_read_bytes_per_s" not in snap.message["metrics"] and "context_switches_per_s" not in snap.message[
        "metrics"]
    assert "load1" in snap.message["metrics"]  # gauges stand
    later = _advance_clock(with_value(NODE_B.read_text(), 'node_disk_read_bytes_total{device="vda"}',
                                      raw_sum(NODE_B, "node_disk_read_bytes_total", device="vda") + 5000.0), 1e7 + 5.0)
    snap = a.assemble([ok(NODE_URL, later, 13.4)], 13.4)  # 5 s on both clocks: rates from the new clock on
    assert snap.message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(1000.0, rel=1e-6)
