"""Time of the five association measures and the consensus selection on a synthetic training set.

Prints one row per measure (seconds over all features on one thread, ms per feature), ``measure_table`` with
its MIC on ``MIC_THREADS`` threads beside one thread (as a ratio), and the whole ``select_features`` call,
against the budget of 10 s for 40 features x 2,000 samples. Import and numba compile time are measured first
and reported on their own row (they are paid once per process).

The time is linear in the number of features (each column is measured on its own), so with 2,000 samples
the budget scales with the features. It is not linear in the samples: Pearson is O(n), Spearman and
Kendall O(n log n), distance correlation O(n^2) up to 256 samples and O(n log n) above, and MIC (minepy's
ApproxMaxMI, B = n^0.6), which dominates, about n^1.8 (4 ms per feature at 500 samples, 51 ms at 2,000,
625 ms at 8,000 on this project's 2-core machine). A budget scaled by the samples would flatter a smaller
run, so with other sample counts there is no budget to compare against and only the figures are printed.

    python3 bench/bench_selection.py            # 40 features x 2,000 samples
    python3 bench/bench_selection.py --quick    # 10 features x 2,000 samples, budget 2.5 s
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

BUDGET_S = 10.0  # all five measures, 40 features x 2,000 samples
BUDGET_FEATURES, BUDGET_SAMPLES = 40, 2000


def synthetic(n: int, f: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f))
    y = X[:, 0] + np.exp(X[:, 1]) + np.sin(3 * X[:, 2]) + rng.normal(scale=0.5, size=n)
    return X, y, [f"f{i}" for i in range(f)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 features x 2,000 samples")
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    args = p.parse_args(argv)
    f = args.features or (10 if args.quick else 40)
    n = args.samples or BUDGET_SAMPLES

    print("importing and compiling (numba kernels) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()

    from app.features.measures import MEASURES, MIC_THREADS, association, measure_table
    from app.features.mic import warm_up
    from app.features.selection import select_features

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_up()
    for m in MEASURES:
        association(m, np.arange(16.0), np.arange(16.0) ** 2)
    t_warm = time.perf_counter() - t0

    X, y, names = synthetic(n, f)
    print(f"measuring {f} features x {n} samples ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    table = measure_table(X, y, names, threads=1)
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    measure_table(X, y, names)
    t_pooled = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = select_features(X, y, names)
    t_select = time.perf_counter() - t0
    budget = BUDGET_S * f / BUDGET_FEATURES if n == BUDGET_SAMPLES else None

    print(f"\nfeature selection: {f} features x {n} samples, chosen {len(res.chosen)}: {', '.join(res.chosen)}")
    print(f"{'step':<28} {'seconds':>9} {'ms/feature':>11}")
    print(f"{'import (app.features)':<28} {t_import:>9.2f} {'':>11}")
    print(f"{'numba compile / cache load':<28} {t_warm:>9.2f} {'':>11}")
    for m in MEASURES:
        s = table.seconds[m]
        print(f"{m:<28} {s:>9.3f} {1000 * s / f:>11.2f}")
    total = sum(table.seconds.values())
    print(f"{'all five measures':<28} {total:>9.3f} {1000 * total / f:>11.2f}")
    print(f"{f'measure_table, {MIC_THREADS} MIC threads':<28} {t_pooled:>9.3f} {1000 * t_pooled / f:>11.2f}"
          f"   {t_one / t_pooled:.2f}x faster than one thread ({t_one:.3f} s)")
    print(f"{'select_features (end to end)':<28} {t_select:>9.3f} {1000 * t_select / f:>11.2f}")
    if budget is None:
        print(f"\nno budget for {n} samples: the {BUDGET_S:.0f} s budget is for {BUDGET_SAMPLES} samples, and the "
              "time is not linear in the samples (see the module's doc)")
    else:
        scale = "" if f == BUDGET_FEATURES else f" ({BUDGET_S:.0f} s x {f}/{BUDGET_FEATURES} features)"
        print(f"\nbudget {budget:.2f} s{scale}; select_features / budget = {t_select / budget:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
