from __future__ import annotations

import pytest
from bridgekit import M40_A, NODE_A, raw_samples
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bridge.errors import ExpositionError
from app.bridge.exposition import parse_exposition

NODE_TEXT = NODE_A.read_text()
NAMES = sorted({line.split("{")[0].split()[0] for line in NODE_TEXT.splitlines() if line and line[0] != "#"})


def test_parses_the_real_node_exporter_capture_with_the_names_it_carries():
    e = parse_exposition(NODE_TEXT)
    cpu = e.get("node_cpu_seconds_total")
    assert len(cpu) == 16
    assert {s.labels["mode"] for s in cpu} >= {"idle", "iowait", "system", "user"}
    iowait1 = next(s.value for s in cpu if s.labels == {"cpu": "1", "mode": "iowait"})
    assert iowait1 == 3.32


def test_a_counter_declared_without_total_keeps_its_name():
    e = parse_exposition(M40_A.read_text())
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in e
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in e
    assert [s.value for s in e.get("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")] == [
        v for _, v in raw_samples(M40_A, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")]


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(NAMES), max_size=12))
def test_filtering_before_parsing_keeps_exactly_the_wanted_samples(keep):
    full = parse_exposition(NODE_TEXT)
    part = parse_exposition(NODE_TEXT, keep=keep)
    assert set(part.samples) == {n for n in keep if n in full}
    for name in part.samples:
        assert part.get(name) == full.get(name)


@pytest.mark.parametrize("text", ["metric{a=\"1\" 2\n", "x abc\n", "# TYPE x\n", "x\n"])
def test_invalid_text_raises_an_exposition_error(text):
    with pytest.raises(ExpositionError):
        parse_exposition(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_either_parses_or_raises_exposition_error(text):
    try:
        parse_exposition(text)
    except ExpositionError:
        pass
