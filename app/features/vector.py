"""Feature names and feature rows: the one place that says how a node's state becomes model input.

node-features carries ``{metric}__{agg}`` for every canonical metric and aggregate; a model row is those,
plus hardware descriptors (:mod:`app.features.hardware`) and task attributes (``task_input_size_mb``).

>>> feature_name("cpu_iowait", "mean")
'cpu_iowait__mean'
>>> split_feature_name("cpu_iowait__mean")
('cpu_iowait', 'mean')
>>> row({"a__mean": 1.0, "b__max": 2.0}, ["b__max", "c__min", "a__mean"]).tolist()
[2.0, nan, 1.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

AGGREGATES = ("mean", "min", "max", "last", "std")
TASK_FEATURES = ("task_input_size_mb",)
RUNNING_PREFIX = "running_pods_"  # task feature per app: its pods on the candidate node (the scheduler's view)
SEP = "__"


def feature_name(metric: str, agg: str) -> str:
    return f"{metric}{SEP}{agg}"


def split_feature_name(name: str) -> tuple[str, str]:
    metric, _, agg = name.rpartition(SEP)
    return (metric, agg) if metric else (name, "")


def row(values: Mapping[str, float], names: Sequence[str]) -> np.ndarray:
    """One float32 row in the order of ``names``; a missing name is NaN (missing to XGBoost)."""
    return np.array([values.get(n, np.nan) for n in names], dtype=np.float32)


def matrix(rows: Sequence[Mapping[str, float]], names: Sequence[str]) -> np.ndarray:
    out = np.full((len(rows), len(names)), np.nan, dtype=np.float32)
    index = {n: j for j, n in enumerate(names)}
    for i, values in enumerate(rows):
        for k, v in values.items():
            j = index.get(k)
            if j is not None:
                out[i, j] = v
    return out
