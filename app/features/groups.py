"""Which group (gpu, cpu, memory, pcie, node) each canonical metric belongs to, as the bridge's mapping says
(``app/bridge/mapping.yaml``, read here as data): the bridge withholds a group it cannot trust and names it in
node-metrics ``stale``, which node-features carries on; the scheduler drops that group's features.

>>> metric_group("nvidia_smi_utilization_gpu"), metric_group("cpu_iowait"), metric_group("no_such_metric")
('gpu', 'cpu', None)
>>> is_stale("nvidia_smi_utilization_gpu__mean", frozenset({"gpu"})), is_stale("cpu_iowait__mean", frozenset({"gpu"}))
(True, False)
>>> is_stale("cpu_iowait__mean", frozenset({"cpu_iowait"}))  # a metric named on its own
True
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path

import yaml

from app.features.vector import split_feature_name

MAPPING = Path(__file__).resolve().parents[1] / "bridge" / "mapping.yaml"


@functools.cache
def _groups() -> dict[str, str]:
    doc = yaml.safe_load(MAPPING.read_text(encoding="utf-8"))
    return {str(name): str(spec["group"]) for name, spec in doc["metrics"].items() if "group" in spec}


def metric_group(metric: str) -> str | None:
    """The group of a canonical metric; None for one the mapping does not define."""
    return _groups().get(metric)


def is_stale(feature: str, stale: Collection[str]) -> bool:
    """Whether ``feature``'s metric is in ``stale``: by its group, or by its own name."""
    if not stale:  # the usual node-features message: nothing withheld, nothing to look up
        return False
    metric = split_feature_name(feature)[0]
    return metric in stale or metric_group(metric) in stale
