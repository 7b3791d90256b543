"""Latency of an explanation for one pod over N candidate nodes, beside the scheduling decision it explains.

The model is the GPU-node preset (reg:gamma, 150 trees, depth 8) trained on synthetic RTT data with ~30
features, saved in a directory registry and served as a FastPredictor, as in the extender. Per N:

- ``decide``: the decision alone (what ``prioritize`` computes);
- ``remembered``: the same decision again with the candidates' rows in the predictor's memory (its other case);
- ``explain approx``: the whole explanation with XGBoost ``approx_contribs`` (the default), booster cached;
- ``explain exact``: the same with exact TreeSHAP (``"contributions": "exact"``);
- ``cold``: the first explanation of a model version, loading the booster from the registry (once).

Every timed call but ``remembered`` starts with the predictor's memory of rows emptied (``FastPredictor.forget``,
outside the timing), so each walks its candidates' rows, as a pod the predictor has not seen does; the same
pod again would time the memory's lookups, not the decision (the pod's input size alone would not help: a
new size in a cell seen before finds its rows remembered, ``app/model/fast.py``).

The goal: an explanation for 64 nodes within 20 ms.

    python3 bench/bench_explain.py            # ~1 min
    python3 bench/bench_explain.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from app.config import Settings
from app.extender.boosters import registry_boosters
from app.model.fast import FastPredictor
from app.model.train import booster_to_bytes, train_model
from app.registry.directory import DirectoryModelStore
from app.registry.store import load_predictor
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.explain import explain
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1_700_000_100.0
GOAL_MS, GOAL_N = 20.0, 64


def _model(n_rows: int, n_features: int, store: DirectoryModelStore) -> list[str]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, n_features)).astype(np.float32)
    y = 150 * np.exp(0.3 * X[:, 0] + 0.2 * np.sin(2 * X[:, 1]) + 0.1 * X[:, 2] * X[:, 3])
    y = y * rng.gamma(30, 1 / 30, n_rows)  # multiplicative noise, as RTT has
    X[rng.random(X.shape) < 0.1] = np.nan
    names = [f"m{i}__mean" for i in range(n_features - 2)] + ["task_input_size_mb", "running_pods_gCTF"]
    res = train_model(X, y, names, "gpu", params={"device": "cpu", "nthread": 1})
    rec = store.save("gCTF:gpu", booster_to_bytes(res.booster), fmt="ubj", features=names, params={}, metrics={},
                     n_samples=n_rows)
    store.promote("gCTF:gpu", rec.version)
    return names


def _view(n: int, names: list[str], store: DirectoryModelStore) -> tuple[SnapshotBuilder, FastPredictor]:
    rng = np.random.default_rng(n)
    b = SnapshotBuilder()
    for i in range(n):
        node = f"gpu-{i:03d}"
        feats = {f: float(v) for f, v in zip(names[:-2], rng.normal(size=len(names) - 2), strict=True)}
        b.apply_node_features({"node": node, "ts": NOW - 1, "node_class": "gpu", "gpu_model": "Tesla M40",
                               "window_s": 30.0, "count": 30, "features": feats})
        b.apply_node_weights({"node": node, "ts": NOW - 1, "weight": 0.8, "predicted_rtt_ms": {}, "stale": False,
                              "samples": {"gCTF": 20}})
    predictor, rec = load_predictor(store, "gCTF:gpu")
    b.set_model("gCTF:gpu", rec.version, predictor)
    return b, predictor


def _ms(fn, reps: int, before=lambda: None) -> np.ndarray:  # type: ignore[no-untyped-def]
    """ms per call of ``fn`` (after one untimed call), ``before`` run untimed ahead of each."""
    before()
    fn()
    out = np.empty(reps)
    for i in range(reps):
        before()
        t0 = time.perf_counter()
        fn()
        out[i] = (time.perf_counter() - t0) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer training rows and repetitions")
    ap.add_argument("--features", type=int, default=30)
    args = ap.parse_args(argv)
    n_rows, reps = (3_000, 10) if args.quick else (20_000, 200)
    sizes = (8, 64) if args.quick else (8, 64, 256)
    tmp = tempfile.TemporaryDirectory(prefix="bench-explain-")
    store = DirectoryModelStore(tmp.name, keep=2)
    print(f"training the GPU preset on {n_rows} rows x {args.features} features ...", file=sys.stderr, flush=True)
    names = _model(n_rows, args.features, store)
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}))
    pod = PodInfo("gctf-1", "em", "uid-1", "gCTF", 512.0)
    settings = Settings.from_env({"RTT_MODELS_DIR": tmp.name})
    rows = []
    for k, n in enumerate(sizes):
        print(f"  [{k + 1}/{len(sizes)}] {n} nodes", file=sys.stderr, flush=True)
        view, predictor = _view(n, names, store)
        snap = view.build(now=NOW)
        nodes = sorted(snap.nodes)
        assumed = AssumedPods()
        cache = registry_boosters(settings)  # a fresh cache: the first explanation loads the booster
        t0 = time.perf_counter()
        first = explain(snap, pod, nodes, assumed, params, NOW, cache.get)
        cold = (time.perf_counter() - t0) * 1e3
        assert cache.loads == 1 and all(node["contributions"] for node in first["nodes"])
        dec = _ms(lambda: decide(snap, pod, nodes, assumed, params, NOW, note_expected=False), reps,
                  predictor.forget)
        kept = _ms(lambda: decide(snap, pod, nodes, assumed, params, NOW, note_expected=False), reps)
        approx = _ms(lambda: explain(snap, pod, nodes, assumed, params, NOW, cache.get), reps, predictor.forget)
        exact = _ms(lambda: explain(snap, pod, nodes, assumed, params, NOW, cache.get, method="exact"),
                    max(3, reps // 10), predictor.forget)
        rows.append((n, np.median(dec), np.median(kept), np.median(approx), np.percentile(approx, 99),
                     np.median(exact), cold))
    tmp.cleanup()
    print(f"\nmodel: GPU preset (reg:gamma), {args.features} features, {n_rows} training rows; {reps} calls each "
          "(exact: a tenth), each with the predictor's memory emptied first (remembered: not); times in ms")
    head = (f"{'nodes':>5} | {'decide p50':>10} {'remembered':>10} | {'explain p50':>11} {'p99':>7} | "
            f"{'exact p50':>9} | {'cold':>7} | {'explain/decide':>14} | goal <= {GOAL_MS:g} ms at {GOAL_N}")
    print(head)
    print("-" * len(head))
    for n, d50, k50, a50, a99, e50, cold in rows:
        goal = ("met" if a99 <= GOAL_MS else "missed") if n == GOAL_N else ""
        print(f"{n:>5} | {d50:>10.2f} {k50:>10.2f} | {a50:>11.2f} {a99:>7.2f} | {e50:>9.1f} | {cold:>7.1f} | "
              f"{a50 / d50:>13.1f}x | {goal}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
