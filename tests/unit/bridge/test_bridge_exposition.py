from __future__ import annotations

import math
import re

import pytest
from bridge_fixtures import M40_A, NODE_A, raw_samples
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


NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gcount", "_gsum")
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(lambda n: not n.endswith(SUFFIXES))
label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
labels = st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,6}", fullmatch=True), label_values, max_size=3)
values = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**15), 10**15).map(float)
# how a family is written: no TYPE line, gauge, untyped, a counter named as its samples (text format), one
# declared without _total and written without it (DCGM), one declared without _total and written with it
KINDS = ("none", "gauge", "untyped", "counter", "counter_bare", "counter_om")


def render_value(v: float) -> str:
    return "NaN" if math.isnan(v) else "+Inf" if v == math.inf else "-Inf" if v == -math.inf else repr(v)


def escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def expositions(draw: st.DrawFn) -> tuple[str, list[tuple[str, dict[str, str], float]]]:
    """A valid text exposition and the samples it carries, by the names they carry in the text."""
    lines: list[str] = []
    expected: list[tuple[str, dict[str, str], float]] = []
    for base in draw(st.lists(names, min_size=1, max_size=5, unique=True)):
        kind = draw(st.sampled_from(KINDS))
        declared, written = {"counter": (base + "_total",) * 2, "counter_bare": (base, base),
                             "counter_om": (base, base + "_total")}.get(kind, (base, base))
        if draw(st.booleans()):
            lines.append(f"# HELP {declared} {escape(draw(label_values))}")
        if kind != "none":
            lines.append(f"# TYPE {declared} {kind.split('_')[0]}")
        for lab in draw(st.lists(labels, min_size=1, max_size=3, unique_by=lambda d: tuple(sorted(d.items())))):
            v = draw(values)
            if kind.startswith("counter") and (math.isnan(v) or v < 0):
                v = abs(v) if not math.isnan(v) else 0.0  # a counter is never negative
            body = ",".join(f'{k}="{escape(x)}"' for k, x in lab.items())
            stamp = f" {draw(st.integers(0, 2 * 10**12))}" if draw(st.booleans()) else ""
            series = f"{written}{{{body}}}" if lab else written
            lines.append(f"{series} {render_value(v)}{stamp}")
            expected.append((written, lab, v))
    return "\n".join(lines) + "\n", expected


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=300, deadline=None)
@given(expositions())
def test_a_valid_exposition_parses_to_exactly_the_samples_it_carries(case):
    text, expected = case
    e = parse_exposition(text)
    got = [(s.name, dict(s.labels), s.value) for name in e.samples for s in e.get(name)]
    assert sorted(n for n, _, _ in got) == sorted(n for n, _, _ in expected), text
    for name, lab, v in expected:
        assert any(n == name and g == lab and same(x, v) for n, g, x in got), (name, lab, v, text)


@settings(max_examples=300, deadline=None)
@given(expositions(), st.data())
def test_filtering_a_valid_exposition_keeps_exactly_the_wanted_samples(case, data):
    text, expected = case
    keep = data.draw(st.sets(st.sampled_from(sorted({n for n, _, _ in expected}))))
    full, part = parse_exposition(text), parse_exposition(text, keep=keep)
    assert set(part.samples) == set(keep)
    for name in keep:
        kept, whole = part.get(name), full.get(name)
        assert [(s.labels, repr(s.value)) for s in kept] == [(s.labels, repr(s.value)) for s in whole]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | expositions().map(lambda c: c[0][: len(c[0]) // 2]))
def test_any_text_parses_to_well_formed_samples_or_raises_an_exposition_error(text):
    try:
        e = parse_exposition(text)
    except ExpositionError as exc:
        assert str(exc).startswith("invalid exposition:")
        return
    for name, samples in e.samples.items():
        assert NAME.match(name), name
        for s in samples:
            assert s.name == name and isinstance(s.value, float)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
