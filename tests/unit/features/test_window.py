"""NodeWindow: incremental bucket aggregates equal a batch recomputation over the raw events."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.features.window import NodeWindow

METRICS = ("gpu_util", "pcie_rx_bytes", "cpu_iowait")

value = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(1e9, 1e9 + 1e3),  # byte counters: large offset, small spread
    st.integers(-1000, 1000).map(float),
)
snapshot = st.fixed_dictionaries({}, optional={m: value for m in METRICS})
events = st.lists(st.tuples(st.floats(1000.0, 1090.0), snapshot), min_size=1, max_size=120)


def batch(evts: list[tuple[float, dict[str, float]]], w: NodeWindow, lo: int, hi: int) -> dict[str, dict[str, float]]:
    """The reference: numpy over the raw events whose bucket is in [lo, hi]."""
    inside = [(i, t, m) for i, (t, m) in enumerate(evts) if lo <= w.bucket_of(t) <= hi]
    out: dict[str, dict[str, float]] = {}
    for name in METRICS:
        rows = [(t, i, m[name]) for i, t, m in inside if name in m]
        if not rows:
            continue
        xs = np.array([r[2] for r in rows])
        last = max(rows, key=lambda r: (r[0], r[1]))[2]  # newest ts, later arrival on ties
        out[name] = {"n": len(xs), "mean": xs.mean(), "std": xs.std(), "min": xs.min(), "max": xs.max(), "last": last}
    return out


def assert_matches(agg, ref: dict[str, dict[str, float]]) -> None:  # type: ignore[no-untyped-def]
    assert sorted(agg.names) == sorted(ref)
    for name, want in ref.items():
        scale = max(1.0, abs(want["min"]), abs(want["max"]))
        for k, v in want.items():
            got = agg.stat(name, k)
            assert math.isclose(got, v, rel_tol=1e-9, abs_tol=1e-9 * scale), (name, k, got, v)


@settings(max_examples=150, deadline=None)
@given(evts=events, window_s=st.integers(1, 40).map(float), until=st.floats(1000.0, 1095.0))
def test_incremental_equals_batch(evts: list[tuple[float, dict[str, float]]], window_s: float, until: float) -> None:
    w = NodeWindow(window_s=window_s, history_s=120.0)
    for t, m in evts:
        assert w.update(t, m)
    hi = w.bucket_of(until)
    lo = hi - int(window_s) + 1
    agg = w.aggregate(until_ts=until, window_s=window_s)
    assert_matches(agg, batch(evts, w, lo, hi))
    assert agg.count == sum(1 for t, _ in evts if lo <= w.bucket_of(t) <= hi)


@settings(max_examples=60, deadline=None)
@given(evts=events)
def test_out_of_order_and_late(evts: list[tuple[float, dict[str, float]]]) -> None:
    """Within the history, arrival order does not matter; older events are dropped and counted."""
    w1, w2 = NodeWindow(history_s=30.0), NodeWindow(history_s=30.0)
    kept1 = [e for e in evts if w1.update(*e)]
    ordered = sorted(evts, key=lambda e: e[0])
    assert all(w2.update(*e) for e in ordered)  # in order, nothing is late
    assert w1.late_dropped == len(evts) - len(kept1)
    assert w1.newest == w2.newest
    newest = w1.newest
    # an event still inside the history when all have arrived was inside it when it arrived
    ref = batch(ordered, w1, newest - 29, newest)
    assert_matches(w1.aggregate(window_s=30.0), ref)
    assert_matches(w2.aggregate(window_s=30.0), ref)


def test_memory_is_bounded() -> None:
    rng = np.random.default_rng(7)
    w = NodeWindow(history_s=60.0)
    names = [f"m{i}" for i in range(30)]
    for i in range(200):
        w.update(1000.0 + i * 0.25, dict(zip(names, rng.normal(size=30).tolist())))
    size = w.nbytes
    for i in range(200, 5000):
        w.update(1000.0 + i * 0.25, dict(zip(names, rng.normal(size=30).tolist())))
    assert w.nbytes == size
    assert w.n_buckets == 61


def test_metric_cap_and_changing_sets() -> None:
    w = NodeWindow(window_s=5.0, history_s=10.0, max_metrics=2)
    w.update(1.0, {"a": 1.0, "b": 2.0})
    w.update(1.5, {"c": 5.0, "b": 4.0})  # c does not fit
    agg = w.aggregate()
    assert w.names == ["a", "b"] and w.metrics_dropped == 1
    assert agg.stat("b", "mean") == 3.0 and agg.stat("a", "n") == 1.0


def test_export_and_load_round_trip() -> None:
    w = NodeWindow(window_s=10.0, history_s=20.0)
    for i in range(40):
        w.update(100.0 + i * 0.5, {"x": float(i), "y": float(i * i)})
    w2 = NodeWindow(window_s=10.0, history_s=20.0)
    w2.declare_metrics(list(w.names))
    for slot in w.take_dirty():
        assert w2.load_slot(*w.export_slot(slot))
    a, b = w.aggregate(), w2.aggregate()
    assert a.features() == b.features() and a.count == b.count
    assert w.take_dirty() == []


@pytest.mark.parametrize("kwargs", [{"bucket_s": 0}, {"history_s": 0.5}, {"window_s": 200.0}, {"max_metrics": 0}])
def test_bad_settings_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        NodeWindow(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(evts=events, asks=st.lists(st.tuples(st.floats(1000.0, 1095.0), st.integers(1, 40).map(float)), min_size=1,
                                  max_size=4))
def test_aggregates_asked_between_updates_follow_every_change(
    evts: list[tuple[float, dict[str, float]]], asks: list[tuple[float, float]],
) -> None:
    """An aggregate asked again before the window changes is the one already merged; after an update it is
    merged afresh: after every event each window asked (twice) equals the batch over the events so far."""
    w = NodeWindow(history_s=120.0)
    for n, (t, m) in enumerate(evts, start=1):
        assert w.update(t, m)
        for until, window_s in asks:
            hi = w.bucket_of(until)
            first = w.aggregate(until_ts=until, window_s=window_s)
            assert w.aggregate(until_ts=until, window_s=window_s) is first
            assert_matches(first, batch(evts[:n], w, hi - int(window_s) + 1, hi))


def test_a_new_metric_or_a_loaded_slot_changes_the_aggregate_and_features_are_a_copy() -> None:
    w = NodeWindow(window_s=10.0, history_s=20.0)
    w.update(100.0, {"x": 1.0})
    a = w.aggregate()
    f = a.features()
    f["x__mean"] = -1.0  # the caller's copy
    assert a.features()["x__mean"] == 1.0 and w.aggregate().features()["x__mean"] == 1.0
    w.declare_metrics(["x", "y"])
    assert w.aggregate() is not a and w.aggregate().names == ["x"]
    assert a.names == ["x"]  # an aggregate handed out keeps its own names
    stats = np.array([[2.0], [5.0], [0.0], [4.0], [6.0], [6.0], [100.5]])
    assert w.load_slot(100, 2.0, stats)
    assert w.aggregate().stat("x", "mean") == 5.0 and w.aggregate().count == 2
