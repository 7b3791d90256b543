"""Time of the five association measures and the consensus selection on a synthetic training set.

Prints one row per measure (seconds over all features, ms per feature) and the whole ``select_features``
call, against the budget of 10 s for 40 features x 2,000 samples. Import and numba compile time are
measured first and reported on their own row (they are paid once per process).

    python3 bench/bench_selection.py            # 40 features x 2,000 samples
    python3 bench/bench_selection.py --quick    # 10 features x 500 samples, a few seconds
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

BUDGET_S = 10.0  # all five measures, 40 features x 2,000 samples


def synthetic(n: int, f: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f))
    y = X[:, 0] + np.exp(X[:, 1]) + np.sin(3 * X[:, 2]) + rng.normal(scale=0.5, size=n)
    return X, y, [f"f{i}" for i in range(f)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 features x 500 samples")
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    args = p.parse_args(argv)
    f = args.features or (10 if args.quick else 40)
    n = args.samples or (500 if args.quick else 2000)

    print("importing and compiling (numba kernels) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()

    from app.features.measures import MEASURES, association, measure_table
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
    table = measure_table(X, y, names)
    t0 = time.perf_counter()
    res = select_features(X, y, names)
    t_select = time.perf_counter() - t0
    budget = BUDGET_S * (f * n) / (40 * 2000) if (f, n) != (40, 2000) else BUDGET_S

    print(f"\nfeature selection: {f} features x {n} samples, chosen {len(res.chosen)}: {', '.join(res.chosen)}")
    print(f"{'step':<28} {'seconds':>9} {'ms/feature':>11}")
    print(f"{'import (app.features)':<28} {t_import:>9.2f} {'':>11}")
    print(f"{'numba compile / cache load':<28} {t_warm:>9.2f} {'':>11}")
    for m in MEASURES:
        s = table.seconds[m]
        print(f"{m:<28} {s:>9.3f} {1000 * s / f:>11.2f}")
    total = sum(table.seconds.values())
    print(f"{'all five measures':<28} {total:>9.3f} {1000 * total / f:>11.2f}")
    print(f"{'select_features (end to end)':<28} {t_select:>9.3f} {1000 * t_select / f:>11.2f}")
    scale = "" if budget == BUDGET_S else " (scaled by features x samples)"
    print(f"\nbudget {budget:.2f} s{scale}; select_features / budget = {t_select / budget:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
