"""The XGBoost build a CPU machine installs (``xgboost-cpu``) against the full wheel (``xgboost``, CUDA inside).

Trains both presets (cpu, gpu node class) on the same seeded data with :func:`app.model.train.train_model`
and prints, per preset, the training time, a sha256 of the saved model and of its predictions. Run it
once in an environment with each build, saving the first run's figures and comparing the second with them
(training seconds side by side with their ratio; equal hashes mean the two builds learn the same model):

    python3 bench/bench_xgboost_build.py --save cpu.json       # in a venv with xgboost-cpu (pip install -e .)
    python3 bench/bench_xgboost_build.py --compare cpu.json    # in a venv with xgboost (pip install xgboost)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import xgboost

from app.model.train import booster_to_bytes, train_model


def data(n: int, d: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[rng.random(X.shape) < 0.05] = np.nan
    y = 50.0 * np.exp(0.4 * np.nan_to_num(X[:, 0]) + 0.2 * np.nan_to_num(X[:, 1])) * rng.lognormal(0, 0.1, n)
    return X, y


def compare(this: dict[str, Any], other: dict[str, Any], name: str) -> None:
    """This run's figures beside another build's (``name``: where they were saved)."""
    print(f"\nthis run against {name}: xgboost {other['xgboost']}  USE_CUDA={other['use_cuda']}  "
          f"repeat={other['repeat']}")
    print(f"{'preset':<7} {'train s':>8} {'other s':>8} {'this/other':>10} {'same model':>10} {'same predictions':>16}")
    for preset, mine in this["presets"].items():
        theirs = other["presets"][preset]
        print(f"{preset:<7} {mine['train_s']:>8.2f} {theirs['train_s']:>8.2f} "
              f"{mine['train_s'] / theirs['train_s']:>9.2f}x {mine['model_sha256'] == theirs['model_sha256']!s:>10} "
              f"{mine['predictions_sha256'] == theirs['predictions_sha256']!s:>16}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="training rows (default 20,000; --quick: 2,000)")
    ap.add_argument("--features", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=None, help="trainings per preset (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="fewer rows, one training per preset")
    ap.add_argument("--save", type=Path, metavar="FILE", help="write this run's figures to FILE (JSON)")
    ap.add_argument("--compare", type=Path, metavar="FILE",
                    help="print this run's figures beside another build's, saved with --save (same rows and features)")
    args = ap.parse_args()
    args.rows = args.rows or (2_000 if args.quick else 20_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    other = json.loads(args.compare.read_text()) if args.compare else None
    if other and (other["rows"], other["features"]) != (args.rows, args.features):
        ap.error(f"{args.compare} was trained on {other['rows']} rows x {other['features']} features, this run on "
                 f"{args.rows} x {args.features}: pass the same --rows and --features (or --quick)")
    X, y = data(args.rows, args.features)
    names = [f"f{i}" for i in range(args.features)]
    info = xgboost.build_info()
    print(f"xgboost {xgboost.__version__}  USE_CUDA={info.get('USE_CUDA')}  rows={args.rows} "
          f"features={args.features}")
    print(f"{'preset':<7} {'train s (median)':>17} {'model sha256':>16} {'predictions sha256':>20}")
    figures: dict[str, Any] = {"xgboost": xgboost.__version__, "use_cuda": bool(info.get("USE_CUDA")),
                               "rows": args.rows, "features": args.features, "repeat": args.repeat, "presets": {}}
    for node_class in ("cpu", "gpu"):
        times, result = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = train_model(X, y, names, node_class=node_class, params={"device": "cpu", "nthread": 1})
            times.append(time.perf_counter() - t0)
        assert result is not None
        model = hashlib.sha256(booster_to_bytes(result.booster, "json")).hexdigest()
        pred = hashlib.sha256(result.booster.inplace_predict(X).astype(np.float32).tobytes()).hexdigest()
        figures["presets"][node_class] = {"train_s": statistics.median(times), "model_sha256": model,
                                          "predictions_sha256": pred}
        print(f"{node_class:<7} {statistics.median(times):>17.2f} {model[:16]:>16} {pred[:16]:>20}")
    if args.save:
        args.save.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"figures saved to {args.save}")
    if other:
        compare(figures, other, str(args.compare))


if __name__ == "__main__":
    main()
