"""Readings slightly out of range are clamped and counted; far out of range, rejected and counted -- per series too."""

from __future__ import annotations

import pytest
import yaml
from bridge_fixtures import NODE_A, NODE_B, NODE_URL, assembler, ok, raw_sum, with_value
from hypothesis import given
from hypothesis import strategies as st

from app.bridge.mapping import DEFAULT_PATH, load_mapping
from app.bridge.ranges import RangeTally, check
from app.bridge.snapshot import NodeAssembler
from app.bridge.targets import Endpoint, Target

DT = raw_sum(NODE_B, "node_time_seconds") - raw_sum(NODE_A, "node_time_seconds")
PRESSURE = "node_pressure_cpu_waiting_seconds_total"
VDB = '{device="vdb"}'


def second_scrape(b_text: str, a_text: str | None = None, mapping=None):
    a = NodeAssembler(Target("worker-3", (Endpoint(NODE_URL),)), mapping) if mapping else assembler(NODE_URL)
    a.assemble([ok(NODE_URL, a_text or NODE_A.read_text(), 0.0)], 0.0)
    return a.assemble([ok(NODE_URL, b_text, DT)], 1.0)  # the bridge's own interval, as the captures'


def stalled(rate: float) -> str:
    """scrape-b with the CPU pressure counter grown by ``rate`` seconds per second of the node clock."""
    return with_value(NODE_B.read_text(), PRESSURE, raw_sum(NODE_A, PRESSURE) + rate * DT)


@pytest.mark.parametrize("rate", [1.0016, 1.019])
def test_a_saturated_pressure_reading_a_little_over_one_is_clamped_not_dropped(rate):
    snap = second_scrape(stalled(rate))
    assert snap.message["metrics"]["cpu_pressure_waiting"] == 1.0
    assert snap.clamped == {"cpu_pressure_waiting": 1} and snap.rejected == {}


def test_a_reading_far_over_the_range_is_rejected_and_counted():
    snap = second_scrape(stalled(1.5))
    assert "cpu_pressure_waiting" not in snap.message["metrics"]
    assert snap.rejected == {"cpu_pressure_waiting": 1} and snap.clamped == {}


def with_disk(busy_vda: float, busy_vdb: float) -> tuple[str, str]:
    """Both captures with a second disk vdb, and io_time grown so that each disk reads ``busy`` over the gap."""
    io = "node_disk_io_time_seconds_total"
    extra_a = f"{io}{VDB} 100\n"
    extra_b = f"{io}{VDB} {100 + busy_vdb * DT}\n"
    b = with_value(NODE_B.read_text(), f'{io}{{device="vda"}}', raw_sum(NODE_A, io, device="vda") + busy_vda * DT)
    return NODE_A.read_text() + extra_a, b + extra_b


def test_a_saturated_disk_is_clamped_per_series_and_does_not_vanish_behind_the_idle_one():
    a, b = with_disk(1.02, 0.30)
    snap = second_scrape(b, a)
    assert snap.message["metrics"]["disk_io_busy"] == 1.0  # the busiest disk, not vdb's 0.30
    assert snap.clamped == {"disk_io_busy": 1}


def test_a_disk_far_out_of_range_is_rejected_and_the_other_disk_still_counts():
    a, b = with_disk(3.0, 0.30)
    snap = second_scrape(b, a)
    assert snap.message["metrics"]["disk_io_busy"] == pytest.approx(0.30)
    assert snap.rejected == {"disk_io_busy": 1}


def test_a_metrics_own_tolerance_in_the_mapping(tmp_path):
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    doc["metrics"]["cpu_pressure_waiting"]["tolerance"] = 0.01
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    mapping = load_mapping(path)
    assert mapping.metric("cpu_pressure_waiting").tolerance == 0.01
    assert mapping.metric("disk_io_busy").tolerance == 0.05  # the default: 5 % of the range's width
    assert second_scrape(stalled(1.0016), mapping=mapping).clamped == {"cpu_pressure_waiting": 1}
    assert second_scrape(stalled(1.019), mapping=mapping).rejected == {"cpu_pressure_waiting": 1}


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
       st.floats(min_value=0.0, max_value=1.0))
def test_a_checked_value_is_in_range_or_rejected_never_outside(v, tolerance):
    tally = RangeTally()
    out = check(v, (0.0, 1.0), tolerance, "m", tally)
    if out is None:
        assert (v < -tolerance or v > 1 + tolerance) and tally.rejected["m"] == 1
    else:
        assert 0.0 <= out <= 1.0
        assert out == v or tally.clamped["m"] == 1


def test_a_negative_gauge_without_a_declared_range_is_rejected_not_published():
    snap = second_scrape(with_value(NODE_B.read_text(), "node_load1", -5.0))
    assert "load1" not in snap.message["metrics"] and snap.rejected == {"load1": 1}
    assert "memory_cached_bytes" in snap.message["metrics"]  # the rest of the group stands
    assert load_mapping().metric("load1").range == (0.0, float("inf"))


def test_a_gpu_temperature_far_below_any_die_is_rejected():
    from bridge_fixtures import DCGM_A, DCGM_URL

    text = DCGM_A.read_text().replace('Hostname="worker-3",DCGM_FI_DRIVER_VERSION="535.129.03"} 61',
                                      'Hostname="worker-3",DCGM_FI_DRIVER_VERSION="535.129.03"} -300', 1)
    assert "} -300" in text
    snap = assembler(DCGM_URL).assemble([ok(DCGM_URL, text, 0.0)], 0.0)
    assert snap.rejected.get("gpu_temperature") == 1
    assert snap.message["metrics"]["gpu_temperature"] > 0  # the other GPU's reading
