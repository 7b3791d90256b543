"""The trainer's history keeps what a model can train on: a sample with a feature name XGBoost refuses, or one whose
new names would push its key's vocabulary past the cap, is refused as a whole (a ``ContractError`` with its
reason: the trainer dead-letters and counts it, one log line), and the key's names and rows stay as they were.

Before, such a name went into the key's history and failed every retrain of the key with a traceback, and a flood
of names filled the vocabulary first come, first kept, with a WARNING per name and sample, so later samples lost
their real features."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from app.errors import ContractError
from app.features.hardware import HARDWARE_FEATURES
from app.model.errors import TrainingError
from app.model.train import train_model
from app.trainer.history import MAX_FEATURES_PER_KEY, SampleHistory, build_dataset

KEY = "gCTF:gpu"


def sample(i: int, key: str = KEY, **features: float) -> dict[str, Any]:
    return {"model_key": key, "task_id": f"t{i}", "app": key.split(":")[0], "node": "n1", "node_class": "gpu",
            "gpu_model": "Tesla M40", "started_ts": 1000.0 + i, "rtt_ms": 100.0 + i, "input_size_mb": 4.0,
            "features": {"cpu_iowait__mean": float(i), "gpu_count__last": 1.0, **features}}


def test_a_feature_name_xgboost_refuses_is_refused_with_the_sample() -> None:
    h = SampleHistory()
    for i in range(3):
        assert h.add(sample(i))
    names = h.snapshot(KEY)[0]
    with pytest.raises(ContractError) as info:
        h.add({**sample(3), "features": {"gpu_util[0]": 50.0, "cpu_iowait__mean": 1.0}})
    assert info.value.reason == "bad_feature_name" and "'gpu_util[0]'" in str(info.value), str(info.value)
    assert h.count(KEY) == 3 and h.snapshot(KEY)[0] == names  # nothing of it kept
    assert h.add(sample(3))  # the task is not held: a good sample of it later is taken
    assert "gpu_util[0]" not in h.dataset(KEY).names


@pytest.mark.parametrize("name", ["a<b", "x]", "ctl\x07", "", "with space"])
def test_a_bad_name_on_a_new_key_leaves_no_key_behind(name: str) -> None:
    h = SampleHistory()
    with pytest.raises(ContractError, match="bad_feature_name"):
        h.add(sample(0, key="new:cpu", **{name: 1.0}))
    assert h.keys() == [] and h.count("new:cpu") == 0 and h.nbytes == 0


def test_a_flood_of_names_is_refused_whole_with_no_warning_per_name(caplog: pytest.LogCaptureFixture) -> None:
    """The reviewer's flood, past what the contract takes (defence in depth): good samples first, then samples of
    2,100 new names each, then good samples again. Each flood sample is one refusal; the good ones after it keep
    every real feature (hardware counts and the task's size included)."""
    h = SampleHistory()
    for i in range(10):
        h.add(sample(i))
    before = h.snapshot(KEY)[0]
    caplog.set_level(logging.DEBUG, logger="app.trainer.history")
    refusals = []
    for i in range(10, 40):
        flood = {f"f{i}_{j}_{'x' * 20}": 0.5 for j in range(2_100)}
        with pytest.raises(ContractError) as info:
            h.add(sample(i, **flood))
        refusals.append(info.value)
    assert {e.reason for e in refusals} == {"feature_vocabulary_full"}
    assert f"more than the {MAX_FEATURES_PER_KEY:,} a key holds" in str(refusals[0]), str(refusals[0])
    assert caplog.records == []  # the caller logs each refusal once; nothing per name
    assert h.snapshot(KEY)[0] == before and h.count(KEY) == 10
    for i in range(40, 60):
        assert h.add(sample(i, hw_extra__mean=1.0))
    ds = h.dataset(KEY)
    assert not np.isnan(ds.column("hw_gpu_count")[-20:]).any()
    assert not np.isnan(ds.column("task_input_size_mb")[-20:]).any()
    assert len(ds.names) < 20


def test_a_key_fills_its_vocabulary_to_the_cap_and_no_further() -> None:
    """Names come in with the samples that bring them, up to the cap; the sample that would pass it is refused, not
    cut; one that brings only known names is still taken."""
    h = SampleHistory()
    h.add(sample(0))
    held = len(h.snapshot(KEY)[0])
    room = MAX_FEATURES_PER_KEY - held
    assert h.add(sample(1, **{f"m{j}": 1.0 for j in range(room)}))
    assert len(h.snapshot(KEY)[0]) == MAX_FEATURES_PER_KEY
    with pytest.raises(ContractError, match="feature_vocabulary_full"):
        h.add(sample(2, one_more=1.0))
    assert h.add(sample(3, m0=2.0))
    assert len(h.snapshot(KEY)[0]) == MAX_FEATURES_PER_KEY and h.count(KEY) == 3


def test_the_largest_sample_the_contract_takes_fits_a_new_key() -> None:
    from app.contracts.names import FEATURE_NAMES_MAX
    h = SampleHistory()
    assert h.add(sample(0, **{f"m{j}": 1.0 for j in range(FEATURE_NAMES_MAX - 2)}))
    assert len(h.snapshot(KEY)[0]) == FEATURE_NAMES_MAX + len(HARDWARE_FEATURES) + 1 <= MAX_FEATURES_PER_KEY


def test_training_names_the_feature_xgboost_would_refuse() -> None:
    """Should such a name reach training anyway, the error names it (and says why), before XGBoost is called."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(size=(40, 2)).astype(np.float32), rng.uniform(100, 200, size=40)
    with pytest.raises(TrainingError) as info:
        train_model(X, y, ["cpu_iowait__mean", "gpu_util[0]"], "gpu", params={"n_estimators": 2})
    assert "'gpu_util[0]'" in str(info.value) and "[, ] or <" in str(info.value), str(info.value)


# A key's vocabulary forgets the names no row it keeps carries: at the cap, a sample's new names take the columns of
# names whose rows have all left (by the per-key cap), so the key learns from fresh samples again. Before, the
# vocabulary only grew: a key that once held 2,000 names refused every later sample with a new name, for good (and
# again after a restart, which replays the same samples).


def named(i: int, names: list[str], key: str = KEY, node: str = "n1", node_class: str = "gpu") -> dict[str, Any]:
    return {"model_key": key, "task_id": f"t{i}", "node": node, "node_class": node_class,
            "gpu_model": "Tesla M40" if node_class == "gpu" else None, "started_ts": 1.7e9 + i, "rtt_ms": 100.0 + i,
            "input_size_mb": 8.0 if node_class == "gpu" else None, "features": {n: float(i) for n in names}}


def test_the_reviewers_sequence_is_taken_once_the_old_rows_are_capped_out() -> None:
    """One sample of 1,500 names, rows with known names that push it out (the per-key cap), then samples of the
    same 600 new names: taken, every one, with their values; and a replay of the same samples (a restart) ends the
    same."""
    old = [f"old_{j}__mean" for j in range(1_500)]
    new = [f"new_{j}__mean" for j in range(600)]

    def replay() -> SampleHistory:
        h = SampleHistory(max_per_key=3)
        assert h.add(named(0, old))
        for i in range(1, 4):  # the hardware and task names only: known; the old row falls out with the third
            assert h.add(named(i, []))
        for i in range(4, 13):
            assert h.add(named(i, new)), i  # refused as feature_vocabulary_full before
        return h

    h = replay()
    ds = h.dataset(KEY)
    assert h.count(KEY) == 3 and ds.y.tolist() == [110.0, 111.0, 112.0]
    assert ds.columns(new).tolist() == [[10.0] * 600, [11.0] * 600, [12.0] * 600]
    assert ds.column("hw_gpu_mem_gb").tolist() == [12.0, 12.0, 12.0]  # the names the rows share kept their values
    assert len(ds.names) <= MAX_FEATURES_PER_KEY and len(set(ds.names)) == len(ds.names)
    assert not set(new) & {n for n in ds.names if n.startswith("old_")}
    again = replay()
    assert again.snapshot(KEY)[0] == h.snapshot(KEY)[0]
    assert np.array_equal(again.dataset(KEY).X, ds.X, equal_nan=True)


def test_the_row_that_falls_out_with_a_sample_makes_room_for_its_names() -> None:
    """At the per-key cap, the oldest row leaves as the sample comes in: its names count as gone already."""
    h = SampleHistory(max_per_key=1)
    assert h.add(named(0, [f"a{j}" for j in range(1_900)]))
    assert h.add(named(1, [f"b{j}" for j in range(1_900)]))
    assert h.add(named(2, [f"a{j}" for j in range(1_900)]))
    ds = h.dataset(KEY)
    assert len(ds) == 1 and ds.column("a1899").tolist() == [2.0] and "b0" not in ds.names


def test_a_name_the_sample_itself_carries_is_not_a_column_its_new_names_take() -> None:
    """A name no row kept carries but the sample brings again is the sample's: its column stays its own."""
    h = SampleHistory(max_per_key=1)
    assert h.add(named(0, ["x", *(f"a{j}" for j in range(1_000))]))  # x: the first column
    assert h.add(named(1, [f"b{j}" for j in range(990)]))  # 1,998 names; the row with x leaves
    assert h.add(named(2, ["x", *(f"c{j}" for j in range(10))]))  # past the cap: a's and b's columns are free
    ds = h.dataset(KEY)
    assert ds.column("x").tolist() == [2.0] and ds.columns([f"c{j}" for j in range(10)]).tolist() == [[2.0] * 10]


def test_names_that_differ_across_a_keys_nodes_roll_through_its_vocabulary() -> None:
    """Each node brings its own 500 names (the per-node cap does not bound their union): the key keeps the newest
    three rows and every sample is taken, each row with its own names' values."""
    h = SampleHistory(max_per_key=3)
    for i in range(40):
        node = f"n{i % 10}"
        assert h.add(named(i, [f"{node}_m{j}__mean" for j in range(500)], node=node)), i
    ds = h.dataset(KEY)
    assert ds.y.tolist() == [137.0, 138.0, 139.0]
    for r, i in enumerate((37, 38, 39)):
        own = ds.columns([f"n{i % 10}_m{j}__mean" for j in range(500)])
        assert (own[r] == float(i)).all() and np.isnan(np.delete(own, r, axis=0)).all()


def test_a_flood_is_still_refused_while_the_rows_kept_use_the_names() -> None:
    """A mapping upgrade moves a key's real rows from one set of names to the next; a flood of invented names
    takes only the columns no row kept uses: refused while the rows kept use too many, and it never takes a name
    of theirs."""
    h = SampleHistory(max_per_key=6)
    a = [f"a{j}__mean" for j in range(1_200)]
    b = [f"b{j}__mean" for j in range(700)]
    c = [f"c{j}__mean" for j in range(700)]
    for i in range(6):
        assert h.add(named(i, a))
    for i in range(6, 12):  # 1,907 names: room below the cap; the rows of a have all left
        assert h.add(named(i, b))
    for i in range(12, 15):  # past the cap but for a's columns: refused before
        assert h.add(named(i, c))
    before_names, before_rows = h.snapshot(KEY)
    for i, n in ((15, 700), (16, 600), (17, 594)):  # kept: 1,407 names (b, c, hardware and task) of 2,000
        with pytest.raises(ContractError, match="feature_vocabulary_full") as info:
            h.add(named(i, [f"flood{i}_{j}" for j in range(n)]))
        assert f"would make {1_407 + n:,} for this key" in str(info.value), str(info.value)
        assert "the key keeps its 1,407" in str(info.value)
    assert h.snapshot(KEY)[0] == before_names and h.count(KEY) == 6 and h.snapshot(KEY)[1] == before_rows
    assert h.add(named(18, [f"flood18_{j}" for j in range(593)]))  # 2,000 exactly: room, taken
    with pytest.raises(ContractError, match="feature_vocabulary_full"):  # one more, though a b row leaves with it
        h.add(named(19, ["flood19_0"]))
    assert h.add(named(20, c))  # the real rows' names are all there: taken, with their values
    ds = h.dataset(KEY)
    assert ds.y.tolist() == [111.0, 112.0, 113.0, 114.0, 118.0, 120.0]
    assert ds.columns(b)[0].tolist() == [11.0] * 700 and np.isnan(ds.columns(b)[1:]).all()
    assert ds.columns(c)[[1, 2, 3, 5]].tolist() == [[v] * 700 for v in (12.0, 13.0, 14.0, 20.0)]
    assert ds.columns([f"flood18_{j}" for j in range(593)])[4].tolist() == [18.0] * 593
    assert not {n for n in ds.names if n.startswith(("flood15", "flood16", "flood17", "flood19"))}


def test_a_snapshot_taken_before_names_are_forgotten_builds_what_it_held() -> None:
    """The retrain builds its dataset from a snapshot off the event loop: a sample that takes the columns of
    forgotten names afterwards changes nothing in it (no row is rewritten)."""
    h = SampleHistory(max_per_key=2)
    for i, prefix in enumerate("aab"):
        assert h.add(named(i, [f"{prefix}{j}" for j in range(990)]))
    names, rows = h.snapshot(KEY)
    held = build_dataset(names, rows)
    assert h.add(named(3, [f"c{j}" for j in range(990)]))  # a's rows are gone: c takes their columns
    assert h.add(named(4, [f"d{j}" for j in range(990)]))
    again = build_dataset(names, rows)
    assert again.names == held.names and np.array_equal(again.X, held.X, equal_nan=True)
    assert held.column("a0")[0] == 1.0 and np.isnan(held.column("a0")[1]) and held.column("b0")[1] == 2.0
    ds = h.dataset(KEY)
    assert ds.column("c0").tolist()[0] == 3.0 and ds.column("d0").tolist()[1] == 4.0 and "a0" not in ds.names


def test_the_hardware_and_task_names_stay_though_no_row_has_a_value_for_them() -> None:
    """A CPU key's GPU descriptors and a sample without a size are NaN in every row: still the key's names, not
    columns a new name takes (else every ordinary sample would bring them back as new names)."""
    key = "upload:cpu"
    h = SampleHistory(max_per_key=1)
    assert h.add(named(0, [f"a{j}" for j in range(1_900)], key=key, node_class="cpu"))
    assert h.add(named(1, [f"b{j}" for j in range(1_950)], key=key, node_class="cpu"))
    names = h.snapshot(key)[0]
    assert {"hw_gpu_mem_gb", "hw_gpu_count", "task_input_size_mb"} <= set(names)
    for i in range(2, 6):
        assert h.add(named(i, [], key=key, node_class="cpu"))
        assert h.snapshot(key)[0] == names


def test_below_the_cap_the_vocabulary_keeps_every_name_in_the_order_it_came() -> None:
    """Nothing changes below the cap: names stay, in arrival order, after their rows leave, and each row is as long
    as the vocabulary was when it came (the later columns NaN)."""
    h = SampleHistory(max_per_key=2)
    for i, names in enumerate((["a"], ["b"], ["c", "a"], [])):
        assert h.add(named(i, names))
    names, rows = h.snapshot(KEY)
    assert names == ("a", *HARDWARE_FEATURES, "task_input_size_mb", "b", "c")
    assert [r[1].shape[0] for r in rows] == [10, 10]
    first = SampleHistory(max_per_key=2)
    assert first.add(named(0, ["a"])) and first.snapshot(KEY)[1][0][1].shape[0] == 8
    ds = h.dataset(KEY)
    assert ds.column("a")[0] == 2.0 and ds.column("c")[0] == 2.0 and np.isnan(ds.column("a")[1])
    assert np.isnan(ds.column("b")).all()


@pytest.mark.parametrize("seed", range(6))
def test_random_samples_at_a_small_cap_keep_every_value_and_refuse_only_past_it(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a cap of 40 names, samples of random names from a pool of 90, in histories of 1 to 6 rows: each kept row
    reads back exactly its own values (NaN elsewhere), a sample is refused only when the names the rows kept after
    it carry (the hardware and task names with them) would be more than the cap, and the per-column counts kept up
    to date match those counted afresh from the rows."""
    from app.trainer import history
    cap = 40
    monkeypatch.setattr(history, "MAX_FEATURES_PER_KEY", cap)
    rng = np.random.default_rng(seed)
    maxlen = int(rng.integers(1, 7))
    h = SampleHistory(max_per_key=maxlen)
    kept: list[dict[str, float]] = []
    base = {*HARDWARE_FEATURES, "task_input_size_mb"}
    for i in range(400):
        names = [f"m{j}" for j in rng.choice(90, size=int(rng.integers(0, 25)), replace=False)]
        stay = kept[1:] if len(kept) == maxlen else kept
        after = base.union(names, *stay)
        try:
            assert h.add(named(i, names))
        except ContractError as exc:
            assert exc.reason == "feature_vocabulary_full" and len(after) > cap, (i, len(after))
        else:
            assert len(after) <= cap
            kept = [*stay, {n: float(i) for n in names}]
        ds = h.dataset(KEY)
        assert len(ds.names) <= cap and len(set(ds.names)) == len(ds.names) and len(ds) == len(kept)
        metric = [n for n in ds.names if n not in base]
        want = [[values.get(n, np.nan) for n in metric] for values in kept]
        assert np.array_equal(ds.columns(metric), np.array(want, dtype=np.float32).reshape(len(kept), -1),
                              equal_nan=True)
        hist = h._keys[KEY]
        if hist.uses is not None:
            assert np.array_equal(hist.uses, hist.count_uses())
