"""Feature selection and models when a metric is absent on a node class, with the metric sets the bridge makes
from the per-GPU exporter fixtures (K20c on nvidia_gpu_exporter 1.2.1, RTX 4090 and A100 on dcgm-exporter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.bridge.mapping import load_mapping
from app.bridge.snapshot import NodeAssembler, TargetResult
from app.bridge.targets import Endpoint, Target
from app.features.classes import CLASS_FEATURES, class_labels, select_by_class
from app.features.selection import select_features
from app.trainer.history import SampleHistory
from app.trainer.pipeline import choose_features, default_selector, train_challenger

EXPORTERS = Path(__file__).resolve().parents[2] / "fixtures" / "exporters"
GPU = {m.name for m in load_mapping().metrics if m.group == "gpu"}


def bridge_metrics(prefix: str, port: int) -> dict[str, float]:
    """The GPU metrics the bridge publishes for the second of a fixture's two scrapes."""
    url = f"http://10.0.0.9:{port}/metrics"
    a = NodeAssembler(Target("n", (Endpoint(url),)), load_mapping())
    a.assemble([TargetResult(url, 0.0, (EXPORTERS / f"{prefix}.scrape-a.prom").read_text())], 0.0)
    snap = a.assemble([TargetResult(url, 8.4, (EXPORTERS / f"{prefix}.scrape-b.prom").read_text())], 8.4)
    return {k: v for k, v in snap.message["metrics"].items() if k in GPU}


CLASSES = {  # gpu_model -> what the bridge publishes for it
    "Tesla K20c": bridge_metrics("nvidia_gpu_exporter-1.2.1.k20c", 9835),
    "NVIDIA GeForce RTX 4090": bridge_metrics("dcgm-exporter-3.3.5.rtx4090", 9400),
    "NVIDIA A100-SXM4-40GB": bridge_metrics("dcgm-exporter-3.3.5-dcp.a100", 9400),
}


def history(rows: dict[str, int], seed: int = 0, spurious: bool = False) -> SampleHistory:
    """Training samples of ``gCTF:gpu``: per GPU model, its fixture's metrics jittered; RTT follows utilisation,
    except on the A100 where it follows PCIe receive throughput (which only the A100 reports)."""
    rng = np.random.default_rng(seed)
    h = SampleHistory(max_per_key=10_000)
    t = 0.0
    for model, n in rows.items():
        base = CLASSES[model]
        for i in range(n):
            x = {f"{k}__mean": v * rng.uniform(0.5, 1.5) for k, v in base.items()}
            if model.startswith("NVIDIA A100"):
                drive = x["pcie_rx_bytes__mean"] / base["pcie_rx_bytes"] if not spurious else float(i)
                rtt = 200.0 * drive
                if spurious:
                    x["pcie_rx_bytes__mean"] = 1e9 * (i + 1)
            else:
                rtt = 100.0 * x["nvidia_smi_utilization_gpu__mean"] / base["nvidia_smi_utilization_gpu"]
            h.add({"model_key": "gCTF:gpu", "node_class": "gpu", "gpu_model": model, "started_ts": t,
                   "rtt_ms": rtt * rng.lognormal(0.0, 0.05), "features": x, "input_size_mb": 100.0})
            t += 1.0
    return h


def test_the_fixtures_give_each_gpu_its_own_metrics():
    assert "pcie_rx_bytes" in CLASSES["NVIDIA A100-SXM4-40GB"]
    assert "pcie_rx_bytes" not in CLASSES["Tesla K20c"] and "pcie_rx_bytes" not in CLASSES["NVIDIA GeForce RTX 4090"]
    ds = history({"Tesla K20c": 40, "NVIDIA A100-SXM4-40GB": 40}).dataset("gCTF:gpu")
    pcie = ds.column("pcie_rx_bytes__mean")
    assert np.isnan(pcie[:40]).all() and np.isfinite(pcie[40:]).all()


def test_no_class_votes_on_a_metric_it_does_not_have():
    ds = history({"Tesla K20c": 60, "NVIDIA GeForce RTX 4090": 60, "NVIDIA A100-SXM4-40GB": 60}).dataset("gCTF:gpu")
    calls = []

    def recording(X, y, names):
        calls.append((X.shape[0], list(names)))
        assert not np.isnan(X).all(axis=0).any()  # no all-NaN column ever reaches a vote
        return default_selector(X, y, names)

    names = choose_features(ds, recording, metric_min_rows=0)
    assert sorted(n for n, _ in calls) == [60, 60, 60]  # one vote per GPU model
    for _, voted in calls:
        assert ("pcie_rx_bytes__mean" in voted) == ("gpu_engine_active__mean" in voted)  # the A100's only
    assert sum("pcie_rx_bytes__mean" in voted for _, voted in calls) == 1
    assert {"pcie_rx_bytes__mean", "nvidia_smi_utilization_gpu__mean"} <= set(names)


def test_each_class_keeps_its_own_feature_set():
    ds = history({"Tesla K20c": 80, "NVIDIA A100-SXM4-40GB": 80}).dataset("gCTF:gpu")
    cands = [n for n in ds.names if n.endswith("__mean")]
    res = select_by_class(default_selector, ds.columns(cands), ds.y, cands, class_labels(ds.columns(CLASS_FEATURES)))
    k20c, a100 = (next(v for k, v in res.per_class.items() if k.startswith(p)) for p in ("5/", "nan/"))
    assert "nvidia_smi_utilization_gpu__mean" in k20c and "pcie_rx_bytes__mean" not in k20c
    assert "pcie_rx_bytes__mean" in a100
    assert set(res.chosen) == set(k20c) | set(a100)


def test_a_class_too_small_to_vote_cannot_carry_its_metric_alone():
    ds = history({"Tesla K20c": 200, "NVIDIA A100-SXM4-40GB": 6}, spurious=True).dataset("gCTF:gpu")
    cands = [n for n in ds.names if n.endswith("__mean")]
    pooled = select_features(ds.columns(cands), ds.y, cands)
    assert "pcie_rx_bytes__mean" in pooled.chosen  # six rows in a line: every measure votes
    assert "pcie_rx_bytes__mean" not in choose_features(ds, default_selector, metric_min_rows=0)


def test_one_class_or_the_same_metrics_everywhere_select_as_before():
    ds = history({"Tesla K20c": 50, "NVIDIA GeForce RTX 4090": 50}).dataset("gCTF:gpu")
    common = [n for n in ds.names if n.endswith("__mean") and n != "pcie_rx_bytes__mean"]
    X = ds.columns(common)
    res = select_by_class(default_selector, X, ds.y, common, class_labels(ds.columns(CLASS_FEATURES)))
    assert list(res.per_class) == ["*"] and res.chosen == tuple(n for n in common if n in select_features(
        X, ds.y, common).chosen)


def test_a_model_predicts_for_every_class_with_the_metric_missing_where_it_is():
    ds = history({"Tesla K20c": 150, "NVIDIA GeForce RTX 4090": 150, "NVIDIA A100-SXM4-40GB": 150},
                 seed=4).dataset("gCTF:gpu")
    order = np.random.default_rng(1).permutation(len(ds))  # classes interleaved in time
    ds = ds.take(order)
    ds = type(ds)(ds.X, ds.y, np.arange(len(ds), dtype=np.float64), ds.names)
    ch = train_challenger(ds, "gpu", seed=0, metric_min_rows=0)
    assert "pcie_rx_bytes__mean" in ch.selected
    h = ch.holdout
    pred = ch.result.booster.inplace_predict(h.columns(ch.selected), missing=np.nan)
    labels = np.array(class_labels(h.columns(CLASS_FEATURES)))
    for label in set(labels):
        mine = labels == label
        err = np.mean(np.abs(pred[mine] - h.y[mine]) / h.y[mine])
        base = np.mean(np.abs(h.y[mine].mean() - h.y[mine]) / h.y[mine])
        assert np.isfinite(pred[mine]).all() and err < 0.6 * base, label


@pytest.mark.parametrize("top_k", [None, 1])
def test_an_all_nan_column_gets_no_vote(top_k):
    from app.features.selection import SelectionRule

    rng = np.random.default_rng(0)
    y = rng.normal(size=100)
    X = np.column_stack([y + rng.normal(scale=0.2, size=100), np.full(100, np.nan)])
    res = select_features(X, y, ["util", "absent"], SelectionRule(top_k=top_k))
    assert res.votes["absent"] == 0 and "absent" in res.degenerate and res.chosen == ("util",)
