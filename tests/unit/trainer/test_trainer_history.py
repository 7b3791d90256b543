"""Sample history: bounded per key, rows in time order, hardware and task features added, compact growth."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from app.trainer.history import SampleHistory, build_dataset, sample_values


def sample(i: int, key: str = "gCTF:gpu", **features: float) -> dict[str, Any]:
    return {"model_key": key, "task_id": f"t{i}", "app": key.split(":")[0], "node": "n1", "node_class": "gpu",
            "gpu_model": "NVIDIA GeForce RTX 4090", "started_ts": 1000.0 + i, "rtt_ms": 10.0 * i,
            "input_size_mb": 4.0, "features": features}


def test_bounded_per_key_keeps_the_newest() -> None:
    h = SampleHistory(max_per_key=5)
    for i in range(12):
        h.add(sample(i, a__mean=float(i)))
        h.add(sample(i, key="upload:cpu", a__mean=float(i)))
    assert h.count("gCTF:gpu") == 5 and h.count("upload:cpu") == 5 and len(h) == 10
    assert h.dataset("gCTF:gpu").y.tolist() == [70.0, 80.0, 90.0, 100.0, 110.0]
    assert h.keys() == ["gCTF:gpu", "upload:cpu"]
    assert h.count("nope:cpu") == 0 and len(h.dataset("nope:cpu")) == 0


def test_vocabulary_grows_and_older_rows_are_missing_in_new_columns() -> None:
    h = SampleHistory()
    h.add(sample(0, a__mean=1.0))
    h.add(sample(1, a__mean=2.0, b__max=5.0))
    ds = h.dataset("gCTF:gpu")
    b = ds.column("b__max")
    assert math.isnan(b[0]) and b[1] == 5.0
    assert ds.column("hw_gpu_mem_bw_gbs").tolist() == [1008.0, 1008.0]
    assert ds.column("task_input_size_mb").tolist() == [4.0, 4.0]
    assert np.isnan(ds.column("never_seen")).all()


def test_rows_are_sorted_by_start_time() -> None:
    h = SampleHistory()
    for i in (3, 1, 2):
        h.add(sample(i, a__mean=float(i)))
    ds = h.dataset("gCTF:gpu")
    assert ds.ts.tolist() == [1001.0, 1002.0, 1003.0]
    assert ds.column("a__mean").tolist() == [1.0, 2.0, 3.0]


def test_snapshot_is_independent_of_later_adds() -> None:
    h = SampleHistory()
    h.add(sample(0, a__mean=1.0))
    names, rows = h.snapshot("gCTF:gpu")
    h.add(sample(1, a__mean=1.0, c__last=3.0))
    assert len(build_dataset(names, rows)) == 1


def test_cpu_sample_without_size_has_missing_values() -> None:
    values = sample_values({"node_class": "cpu", "gpu_model": None, "features": {"x": 1.0}})
    assert values["x"] == 1.0 and math.isnan(values["task_input_size_mb"]) and math.isnan(values["hw_gpu_mem_gb"])


def test_bad_bound_raises() -> None:
    with pytest.raises(ValueError):
        SampleHistory(max_per_key=0)


def test_sample_hardware_counts_come_from_the_gauges_the_extender_reads() -> None:
    values = sample_values({"node_class": "gpu", "gpu_model": "Tesla M40",
                            "features": {"gpu_count__last": 2.0, "cpu_count__last": 16.0}})
    assert values["hw_gpu_count"] == 2.0 and values["hw_cpu_cores"] == 16.0 and values["hw_gpu_fp32_tflops"] == 7.0
    cpu = sample_values({"node_class": "cpu", "gpu_model": None, "features": {"gpu_count__last": 2.0}})
    assert math.isnan(cpu["hw_gpu_count"])


def test_an_idle_key_is_dropped_and_a_new_sample_starts_it_again() -> None:
    h = SampleHistory()
    for i in range(50):
        h.add(sample(i, a__mean=float(i)), now=float(i))
        h.add(sample(i, key="upload:cpu", a__mean=float(i)), now=float(i) if i < 10 else 9.0)
    assert h.nbytes == 100 * h.snapshot("gCTF:gpu")[1][0][1].nbytes
    assert h.drop_idle(now=100.0, idle_s=91.0, keep={"upload:cpu"}) == []  # a key training is kept
    assert h.drop_idle(now=100.0, idle_s=91.0) == ["upload:cpu"]  # its newest sample came at 9
    assert h.keys() == ["gCTF:gpu"] and len(h) == 50 and h.nbytes == 50 * h.snapshot("gCTF:gpu")[1][0][1].nbytes
    assert h.add(sample(3, key="upload:cpu"), now=101.0)  # not a redelivery: the dropped history is gone
    assert h.count("upload:cpu") == 1 and h.dataset("upload:cpu").y.tolist() == [30.0]


def test_the_history_bytes_follow_the_rows_that_fall_out() -> None:
    h = SampleHistory(max_per_key=3)
    for i in range(10):
        h.add(sample(i, a__mean=1.0, b__mean=2.0))
    assert h.nbytes == sum(r[1].nbytes for r in h.snapshot("gCTF:gpu")[1])
