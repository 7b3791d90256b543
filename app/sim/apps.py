"""Service-time models of the three cryo-EM apps, and which metrics truly drive each one's RTT.

The expected service time of a task on a node is

``t = (overhead_ms + input_mb * ms_per_mb(node)) * (1 + sum_r weight[r] * load[r]) * throttle * slowdown``

where ``ms_per_mb`` follows the hardware (GPU: FP32 throughput, memory bandwidth and the PCIe link;
CPU node: a fixed per-MB cost, 10-30x a mid GPU), and ``load[r]`` is what the *other* tasks (plus any
noisy neighbour) put on shared resource ``r`` (GPU compute, GPU memory bandwidth, PCIe, disk, CPU).
The observed time multiplies a log-normal noise whose sigma is 3-5x larger on GPU nodes (the seed).

>>> from app.sim.hardware import small_preset
>>> k20c, m40, rtx, cpu = small_preset()[:4]
>>> [round(ideal_ms(APPS["gCTF"], n, 80.0)) for n in (rtx, m40, k20c, cpu)]
[32, 100, 144, 1442]
>>> APPS["Motioncor2"].fits(k20c, 400.0), APPS["Motioncor2"].fits(rtx, 400.0)
(False, True)
>>> sorted(true_drivers("upload"))
['cpu_iowait', 'disk_read_bytes_per_s', 'pcie_rx_bytes', 'pcie_tx_bytes']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from app.sim.hardware import NodeSpec

RESOURCES = ("gpu", "membw", "pcie", "disk", "cpu")

# which emitted metrics reflect the load on each shared resource (see app.sim.metrics)
RESOURCE_METRICS: dict[str, tuple[str, ...]] = {
    "gpu": ("nvidia_smi_utilization_gpu", "cuda_stream_active"),
    "membw": ("nvidia_smi_memory_used", "cuda_stream_active"),
    "pcie": ("pcie_rx_bytes", "pcie_tx_bytes"),
    "disk": ("disk_read_bytes_per_s", "cpu_iowait"),
    "cpu": ("cpu_usage_user", "cpu_usage_system"),
    "throttle": ("gpu_sm_clock_mhz", "gpu_temperature"),
}
DRIVER_WEIGHT = 0.3  # a resource whose contention weight reaches this drives the app's RTT

NOISE_SIGMA = {"gpu": 0.04, "cpu": 0.01}  # log-normal sigma of the service time, by node class


@dataclasses.dataclass(frozen=True)
class Placement:
    """How an app runs on one node class: cost, requests, what it puts on shared resources."""

    overhead_ms: float
    cpu_cores: float  # requested and used
    mem_gb: float  # requested host memory
    gpu_share: int  # time-sliced GPU shares requested (0 on CPU nodes)
    weights: Mapping[str, float]  # contention sensitivity per resource
    demand: Mapping[str, float]  # load this task puts on each resource (fraction of one unit)
    cpu_ms_per_mb: float = 0.0  # CPU nodes only
    throttle_sensitive: bool = False


@dataclasses.dataclass(frozen=True)
class AppProfile:
    name: str
    on_gpu: Placement | None  # None: the app never uses a GPU
    on_cpu: Placement
    tflops_ms: float = 0.0  # ms per MB * TFLOPS (compute part)
    bw_ms: float = 0.0  # ms per MB * GB/s (memory-bandwidth part)
    pcie_ms: float = 0.0  # ms per MB * GB/s of the link (transfer part)
    disk_ms: float = 0.0  # ms per MB * MB/s of the disk (I/O part)
    gpu_mem_base_gb: float = 0.0
    gpu_mem_per_mb: float = 0.0  # GB of GPU memory per MB of input

    def placement(self, node: NodeSpec) -> Placement:
        return self.on_gpu if (node.node_class == "gpu" and self.on_gpu is not None) else self.on_cpu

    def gpu_mem_gb(self, input_mb: float) -> float:
        return self.gpu_mem_base_gb + self.gpu_mem_per_mb * input_mb

    def fits(self, node: NodeSpec, input_mb: float) -> bool:
        """False when the node can never run this task (its GPU memory is too small for the input)."""
        if node.node_class == "gpu" and self.on_gpu is not None and node.gpu is not None:
            return self.gpu_mem_gb(input_mb) <= node.gpu.mem_gb
        return True


def ms_per_mb(app: AppProfile, node: NodeSpec) -> float:
    """Uncontended cost of one MB of input on ``node``."""
    per_mb = app.disk_ms / node.disk_mb_s if app.disk_ms else 0.0
    if node.node_class == "gpu" and node.gpu is not None:
        if app.on_gpu is not None:
            per_mb += app.tflops_ms / node.gpu.fp32_tflops + app.bw_ms / node.gpu.mem_bw_gbs
        return per_mb + app.pcie_ms / node.pcie_gbs
    return per_mb + app.on_cpu.cpu_ms_per_mb


def ideal_ms(app: AppProfile, node: NodeSpec, input_mb: float) -> float:
    """Service time on an idle, healthy node (no contention, no noise)."""
    return app.placement(node).overhead_ms + input_mb * ms_per_mb(app, node)


def contention_factor(place: Placement, loads: Mapping[str, float]) -> float:
    """``1 + sum_r weight[r] * load[r]`` (loads from the other tasks and background)."""
    f = 1.0
    for r, w in place.weights.items():
        f += w * loads.get(r, 0.0)
    return f


APPS: dict[str, AppProfile] = {
    "upload": AppProfile(
        "upload", on_gpu=None,
        on_cpu=Placement(5.0, 1.0, 1.0, 0, weights={"disk": 1.0, "pcie": 0.5, "cpu": 0.1},
                         demand={"disk": 0.5, "pcie": 0.3, "cpu": 1.0}),
        disk_ms=1000.0, pcie_ms=10.0,
    ),
    "gCTF": AppProfile(
        "gCTF",
        on_gpu=Placement(5.0, 1.0, 2.0, 1, weights={"gpu": 0.8, "membw": 0.3, "pcie": 0.1},
                         demand={"gpu": 0.5, "membw": 0.3, "pcie": 0.1, "cpu": 1.0}, throttle_sensitive=True),
        on_cpu=Placement(10.0, 4.0, 4.0, 0, weights={"cpu": 1.2, "disk": 0.1},
                         demand={"cpu": 4.0, "disk": 0.05}, cpu_ms_per_mb=17.9),
        tflops_ms=0.6, bw_ms=300.0, pcie_ms=1.0, gpu_mem_base_gb=0.5, gpu_mem_per_mb=0.01,
    ),
    "Motioncor2": AppProfile(
        "Motioncor2",
        on_gpu=Placement(8.0, 2.0, 4.0, 1, weights={"membw": 1.2, "gpu": 0.4, "pcie": 0.2},
                         demand={"gpu": 0.4, "membw": 0.6, "pcie": 0.2, "cpu": 2.0}, throttle_sensitive=True),
        on_cpu=Placement(20.0, 8.0, 8.0, 0, weights={"cpu": 1.0, "disk": 0.2},
                         demand={"cpu": 8.0, "disk": 0.1}, cpu_ms_per_mb=24.0),
        tflops_ms=0.3, bw_ms=500.0, pcie_ms=1.0, gpu_mem_base_gb=1.0, gpu_mem_per_mb=0.012,
    ),
}


def true_drivers(app: str) -> set[str]:
    """Metric names that truly drive ``app``'s RTT in the simulator (ground truth for feature selection)."""
    profile = APPS[app]
    out: set[str] = set()
    for place in (profile.on_gpu, profile.on_cpu):
        if place is None:
            continue
        for r, w in place.weights.items():
            if w >= DRIVER_WEIGHT:
                out.update(RESOURCE_METRICS[r])
        if place.throttle_sensitive:
            out.update(RESOURCE_METRICS["throttle"])
    return out


def selection_scores(app: str, chosen: set[str] | list[str] | tuple[str, ...]) -> tuple[float, float]:
    """(precision, recall) of a chosen feature set against :func:`true_drivers`.

    Feature names ``metric__agg`` count as their metric; names that are not metrics are ignored.

    >>> selection_scores("upload", ["disk_read_bytes_per_s__mean", "cpu_idle__last", "task_input_size_mb"])
    (0.5, 0.25)
    """
    truth = true_drivers(app)
    metrics = {c.rpartition("__")[0] or c for c in chosen}
    metrics = {m for m in metrics if any(m in ms for ms in RESOURCE_METRICS.values()) or m in _OTHER_METRICS}
    if not metrics:
        return 0.0, 0.0
    hit = len(metrics & truth)
    return hit / len(metrics), hit / len(truth)


_OTHER_METRICS = frozenset({"cpu_idle", "memory_cache_usage", "disk_written_bytes_per_s", "memory_used_fraction"})
