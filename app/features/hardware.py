"""Hardware descriptors of a node as model features: GPU memory, memory bandwidth, FP32 throughput, PCIe
generation (the vendors' data sheets), CPU cores and the number of GPUs.

They let a model of a node class tell its nodes apart, and predict for an unseen node whose GPU is one of
the models in :data:`GPUS` (Tesla K20c, Tesla M40 12/24 GB, RTX 4090). For any other GPU model, and for
a CPU node, the four GPU descriptors (PCIe included) are NaN, as are unknown CPU cores: missing to
XGBoost, so such a node is predicted the way the trees route missing values, not from its hardware.

The two counts come from the node's own gauges (:data:`CPU_CORES`, :data:`GPU_COUNT`), read the same way by
the extender, the worker and the trainer. The GPU count tells a node whose pods share one GPU from one of
the same GPU model whose pods spread over two: a model that sees only the running pods and the GPU model
cannot (on the simulator's large preset, half the nodes of each GPU model have two GPUs).

>>> gpu_spec("NVIDIA GeForce RTX 4090").mem_bw_gbs
1008.0
>>> hardware_features("gpu", "Tesla K20c", cpu_cores=16)["hw_gpu_fp32_tflops"]
3.52
>>> import math; math.isnan(hardware_features("cpu", None, cpu_cores=32)["hw_gpu_mem_gb"])
True
>>> hardware_features("gpu", "Tesla M40", gpu_count=2.0)["hw_gpu_count"]
2.0
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    model: str
    mem_gb: float
    mem_bw_gbs: float  # GB/s
    fp32_tflops: float
    pcie_gen: int


GPUS: dict[str, GpuSpec] = {
    "tesla k20c": GpuSpec("Tesla K20c", 5.0, 208.0, 3.52, 2),
    "tesla m40": GpuSpec("Tesla M40", 12.0, 288.0, 7.0, 3),
    "tesla m40 24gb": GpuSpec("Tesla M40 24GB", 24.0, 288.0, 7.0, 3),
    "rtx 4090": GpuSpec("RTX 4090", 24.0, 1008.0, 82.6, 4),
}

HARDWARE_FEATURES = ("hw_gpu_mem_gb", "hw_gpu_mem_bw_gbs", "hw_gpu_fp32_tflops", "hw_pcie_gen", "hw_cpu_cores",
                     "hw_gpu_count")

# the count gauges the hardware descriptors ``hw_cpu_cores`` and ``hw_gpu_count`` are read from (the bridge's
# ``cpu_count`` and ``gpu_count``: distinct ``cpu`` labels of node_exporter, ``gpu`` labels of the GPU exporter)
CPU_CORES = "cpu_count__last"
GPU_COUNT = "gpu_count__last"


def _normalise(name: str) -> str:
    n = name.lower()
    n = re.sub(r"\b(nvidia|geforce)\b", " ", n)
    return re.sub(r"\s+", " ", n).strip()


@functools.lru_cache(maxsize=1024)
def gpu_spec(model: str | None) -> GpuSpec | None:
    """The spec of a GPU model as exporters name it (``modelName`` label), or None if unknown (kept per
    name: every node-features message asks)."""
    if not model:
        return None
    return GPUS.get(_normalise(model))


def hardware_features(node_class: str, gpu_model: str | None, cpu_cores: float | None = None,
                      gpu_count: float | None = None) -> dict[str, float]:
    """Hardware descriptors as model features; unknown values are NaN (XGBoost treats them as missing), and so
    is a count that is not a positive number (a gauge that could not be read)."""
    spec = gpu_spec(gpu_model) if node_class == "gpu" else None
    nan = math.nan
    return {
        "hw_gpu_mem_gb": spec.mem_gb if spec else nan,
        "hw_gpu_mem_bw_gbs": spec.mem_bw_gbs if spec else nan,
        "hw_gpu_fp32_tflops": spec.fp32_tflops if spec else nan,
        "hw_pcie_gen": float(spec.pcie_gen) if spec else nan,
        "hw_cpu_cores": _or_nan(usable_count(cpu_cores)),
        "hw_gpu_count": _or_nan(usable_count(gpu_count)) if node_class == "gpu" else nan,
    }


def usable_count(value: float | None) -> float | None:
    """A positive, finite count as a float; None otherwise (a gauge not reported or not readable).

    >>> usable_count(2), usable_count(0.0), usable_count(None), usable_count(float("inf"))
    (2.0, None, None, None)
    """
    return float(value) if value is not None and math.isfinite(value) and value > 0 else None


def node_counts(features: Mapping[str, float]) -> tuple[float | None, float | None]:
    """``(cpu_cores, gpu_count)`` from a node's features (its :data:`CPU_CORES` and :data:`GPU_COUNT` gauges),
    each None when not usable: what :func:`hardware_features` takes after the GPU model.

    >>> node_counts({"cpu_count__last": 16.0, "gpu_count__last": 0.0})
    (16.0, None)
    """
    return usable_count(features.get(CPU_CORES)), usable_count(features.get(GPU_COUNT))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value
