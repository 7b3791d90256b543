"""Per-call latency of FastPredictor against XGBoost's Booster.inplace_predict.

The model is the GPU-node preset (150 trees, depth 8, learning rate 0.05) trained on synthetic RTT data
with ~30 features (10 % missing); every batch size N is one pod scored on N candidate nodes.

Every timed call gets N rows never seen before, the same rows for both sides: the predictor remembers rows
it has predicted (``app/model/fast.py``), so the same batch again would time its memory, not the walk. The
``remembered`` column is that other case, labelled as such: the same N rows again, found in the memory.

    python3 bench/bench_predict.py            # full run (~1 min)
    python3 bench/bench_predict.py --quick    # a few seconds

A second table prices the predictor's memory of rows (``app/model/fast.py``): calls of N rows it has
never seen (walked, then remembered), of N rows it remembers, and the tree walk alone over the same rows.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import xgboost
from arguments import positive_int

from app.model.fast import FastPredictor
from app.model.presets import xgb_params
from app.model.train import train_model

BATCHES = (1, 4, 16, 64, 128, 512)
ROUNDS = 4


def synthetic(n: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_features)).astype(np.float32)
    y = 150 + 40 * X[:, 0] + 25 * np.sin(2 * X[:, 1]) + 15 * X[:, 2] * X[:, 3] + 10 * np.abs(X[:, 4])
    y = y + rng.normal(scale=5, size=n)
    X[rng.random(X.shape) < 0.1] = np.nan
    return X, y


def fresh(rng: np.random.Generator, n: int, n_features: int) -> np.ndarray:
    """``n`` new rows drawn as :func:`synthetic` draws them (10 % NaN)."""
    X = rng.normal(size=(n, n_features)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    return X


def timings_us(fn, inputs: list[np.ndarray]) -> np.ndarray:
    """µs per call of ``fn``, one call per array of ``inputs``."""
    out = np.empty(len(inputs))
    for i, X in enumerate(inputs):
        t0 = time.perf_counter_ns()
        fn(X)
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer training rows and repetitions")
    ap.add_argument("--features", type=positive_int, default=30)
    ap.add_argument("--nthread", type=positive_int, default=1,
                    help="XGBoost threads for training and inplace_predict (0 = all cores; on a busy machine "
                         "OpenMP's waits make that far slower per call)")
    args = ap.parse_args(argv)
    n_rows, reps = (3_000, 100) if args.quick else (20_000, 1000)

    print(f"training the GPU preset on {n_rows} rows x {args.features} features ...", file=sys.stderr, flush=True)
    X, y = synthetic(n_rows, args.features)
    names = [f"m{i}__mean" for i in range(args.features)]
    t0 = time.perf_counter()
    params = {"device": "cpu", "nthread": args.nthread}
    res = train_model(X, y, names, "gpu", params=params)
    booster: xgboost.Booster = res.booster
    preset = xgb_params("gpu", device="cpu")
    print(f"  trained in {time.perf_counter() - t0:.1f} s; loading FastPredictor ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    fast = FastPredictor.from_booster(booster)
    load_ms = (time.perf_counter() - t0) * 1e3

    def inplace(a: np.ndarray) -> np.ndarray:
        return booster.inplace_predict(a, missing=np.nan)

    rows, _ = synthetic(max(BATCHES), args.features, seed=1)
    table = []
    for i, n in enumerate(BATCHES):
        print(f"  [{i + 1}/{len(BATCHES)}] N={n}", file=sys.stderr, flush=True)
        batch = np.ascontiguousarray(rows[:n])
        want = booster.inplace_predict(batch)
        err = float(np.max(np.abs(fast.predict(batch) - want) / np.abs(want)))  # fast now remembers batch
        gen = np.random.default_rng(100 + n)
        for X in [fresh(gen, n, args.features) for _ in range(5)]:  # warm-up, rows never used again
            inplace(X)
            fast.predict(X)
        # alternate the two in rounds, so a burst of load on the shared machine hits both alike; each round
        # draws new rows, and both sides predict the same ones
        xgb_parts, fast_parts, kept_parts = [], [], []
        for _ in range(ROUNDS):
            inputs = [fresh(gen, n, args.features) for _ in range(reps // ROUNDS)]
            xgb_parts.append(timings_us(inplace, inputs))
            fast_parts.append(timings_us(fast.predict, inputs))
            kept_parts.append(timings_us(fast.predict, [batch] * (reps // ROUNDS)))
        xgb_t, fast_t, kept_t = (np.concatenate(p) for p in (xgb_parts, fast_parts, kept_parts))
        table.append((n, *np.percentile(xgb_t, [50, 99]), *np.percentile(fast_t, [50, 99]), np.median(kept_t), err))

    print(f"\nmodel: {fast.n_trees} trees, max_depth {preset['max_depth']}, {args.features} features; "
          f"FastPredictor load {load_ms:.0f} ms; XGBoost nthread {args.nthread}; {reps} calls each, every call "
          "new rows (the same for both); remembered: the same N rows again, found in the predictor's memory")
    head = f"{'N':>5} | {'inplace p50 us':>14} {'p99 us':>9} | {'fast p50 us':>11} {'p99 us':>9} | " \
           f"{'ratio p50':>9} {'p99':>6} | {'remembered p50':>14} {'ratio':>7} | {'max rel err':>11}"
    print(head)
    print("-" * len(head))
    for n, xp50, xp99, fp50, fp99, kp50, err in table:
        print(f"{n:>5} | {xp50:>14.1f} {xp99:>9.1f} | {fp50:>11.1f} {fp99:>9.1f} | {xp50 / fp50:>8.1f}x "
              f"{xp99 / fp99:>5.1f}x | {kp50:>14.1f} {xp50 / kp50:>6.1f}x | {err:>11.1e}")
    memory_table(fast, args.features, 20 if args.quick else 100)
    return 0


def memory_table(fast: FastPredictor, n_features: int, calls: int) -> None:
    """The memory of rows: µs per call (best of 3 rounds of ``calls`` calls) for new, remembered and walked rows."""
    print(f"\nthe predictor's memory of rows: us per call, best of 3 rounds of {calls} calls")
    head = f"{'N':>5} | {'new rows':>9} {'remembered':>10} {'walk alone':>10} | {'new / walk':>10} {'kept / walk':>11}"
    print(head)
    print("-" * len(head))
    for n in (64, 512, 5000):
        print(f"  N={n}", file=sys.stderr, flush=True)
        k = min(calls, max(1, 16_000 // n))  # the new rows of a round fit in the memory: the next round finds them
        best = {"new": np.inf, "kept": np.inf, "walk": np.inf}
        for r in range(3):
            batches = [synthetic(n, n_features, seed=1000 * r + i + 10)[0] for i in range(k)]
            fast.forget()
            for name, fn in (("walk", fast._walk), ("new", fast.predict), ("kept", fast.predict)):
                t0 = time.perf_counter()
                for batch in batches:
                    fn(batch)
                best[name] = min(best[name], (time.perf_counter() - t0) / k * 1e6)
        print(f"{n:>5} | {best['new']:>9.1f} {best['kept']:>10.1f} {best['walk']:>10.1f} | "
              f"{best['new'] / best['walk']:>9.2f}x {best['kept'] / best['walk']:>10.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
