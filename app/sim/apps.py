"""Service-time models of the three cryo-EM apps, their requests, and which metrics truly drive their RTT.

An app's pod requests the same resources wherever it lands (``Placement``: CPU cores, host memory, and for
a GPU app one ``nvidia.com/gpu`` share plus its GPU memory). A GPU app (``gCTF``, ``Motioncor2``) is
feasible on GPU nodes only; ``upload`` requests no GPU and runs on any node.

The uncontended service time of a task (its *work*) on a node is ``overhead_ms + input_mb * ms_per_mb(node)``,
where ``ms_per_mb`` follows the hardware (GPU: FP32 throughput, memory bandwidth and the PCIe link; disk
bandwidth; CPU node: a fixed per-MB cost). While the task runs, the node serves it at rate
``1 / factor`` with

``factor = (1 + sum_r weight[r] * load[r] + sum_b pair(app, b)) * throttle * slowdown``

re-evaluated whenever a task starts or ends on the node (:mod:`app.sim.state`): processor sharing per
resource, in its mean-field form - ``weight[r]`` is the fraction of the app's time bound by resource
``r``, ``load[r]`` is the demand the *other* running tasks (and any noisy neighbour) put on ``r`` (GPU
compute and memory bandwidth of the same GPU; PCIe, disk and CPU of the node), so the ``r``-bound part of
the work stretches by ``1 + load[r]``. ``pair`` adds the interference of app pairs that hurt each other
beyond their resource demand on one GPU (:data:`INTERFERENCE`). The observed work multiplies a log-normal
noise whose sigma is 4x larger on GPU nodes (the seed's 3-5x).

>>> from app.sim.hardware import small_preset
>>> k20c, m40, rtx, cpu = small_preset()[:4]
>>> [round(ideal_ms(APPS["gCTF"], n, 80.0)) for n in (rtx, m40, k20c)]
[32, 100, 144]
>>> APPS["gCTF"].fits(cpu, 80.0), APPS["upload"].fits(cpu, 80.0)
(False, True)
>>> APPS["Motioncor2"].fits(k20c, 400.0), APPS["Motioncor2"].fits(rtx, 400.0)
(False, True)
>>> interference("Motioncor2", "gCTF"), interference("gCTF", "gCTF")
(0.25, 0.0)
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
    """How an app runs: its pod's requests, its cost, and what it puts on shared resources."""

    overhead_ms: float
    cpu_cores: float  # requested and used
    mem_gb: float  # requested host memory
    gpu_share: int  # nvidia.com/gpu requested: time-sliced shares of one GPU (0: no GPU)
    weights: Mapping[str, float]  # fraction of the app's time bound by each resource
    demand: Mapping[str, float]  # load this task puts on each resource (fraction of one unit)
    cpu_ms_per_mb: float = 0.0  # CPU nodes only
    throttle_sensitive: bool = False

    def __post_init__(self) -> None:
        for r in (*self.weights, *self.demand):
            if r not in RESOURCES:
                raise ValueError(f"Placement: unknown resource {r!r} (known: {', '.join(RESOURCES)})")
        # dense vectors in RESOURCES order, for the re-rating hot path
        object.__setattr__(self, "w", tuple(float(self.weights.get(r, 0.0)) for r in RESOURCES))
        object.__setattr__(self, "d", tuple(float(self.demand.get(r, 0.0)) for r in RESOURCES))

    w: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)
    d: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class AppProfile:
    """An app: exactly one of ``on_gpu`` (a GPU app: GPU nodes only) and ``on_cpu`` (any node) is set."""

    name: str
    on_gpu: Placement | None  # requests nvidia.com/gpu: runs on GPU nodes only
    on_cpu: Placement | None  # requests no GPU: runs on any node
    tflops_ms: float = 0.0  # ms per MB * TFLOPS (compute part)
    bw_ms: float = 0.0  # ms per MB * GB/s (memory-bandwidth part)
    pcie_ms: float = 0.0  # ms per MB * GB/s of the link (transfer part)
    disk_ms: float = 0.0  # ms per MB * MB/s of the disk (I/O part)
    gpu_mem_base_gb: float = 0.0
    gpu_mem_per_mb: float = 0.0  # GB of GPU memory per MB of input

    place: Placement = dataclasses.field(init=False, repr=False, compare=False)  # the one that is set

    def __post_init__(self) -> None:
        if (self.on_gpu is None) == (self.on_cpu is None):
            raise ValueError(f"AppProfile {self.name}: exactly one of on_gpu and on_cpu must be set")
        object.__setattr__(self, "place", self.on_gpu or self.on_cpu)

    @property
    def wants_gpu(self) -> bool:
        return self.on_gpu is not None

    def placement(self, node: NodeSpec) -> Placement:
        return self.place

    def gpu_mem_gb(self, input_mb: float) -> float:
        return self.gpu_mem_base_gb + self.gpu_mem_per_mb * input_mb if self.on_gpu is not None else 0.0

    def fits(self, node: NodeSpec, input_mb: float) -> bool:
        """Whether ``node`` can ever run this task: a GPU app needs a GPU node whose GPU holds its input."""
        if self.on_gpu is None:
            return True
        return node.gpu is not None and self.gpu_mem_gb(input_mb) <= node.gpu.mem_gb


def ms_per_mb(app: AppProfile, node: NodeSpec) -> float:
    """Uncontended cost of one MB of input on ``node`` (which must be able to run ``app``)."""
    per_mb = app.disk_ms / node.disk_mb_s if app.disk_ms else 0.0
    if node.gpu is not None:
        if app.on_gpu is not None:
            per_mb += app.tflops_ms / node.gpu.fp32_tflops + app.bw_ms / node.gpu.mem_bw_gbs
        return per_mb + app.pcie_ms / node.pcie_gbs
    return per_mb + app.place.cpu_ms_per_mb


def ideal_ms(app: AppProfile, node: NodeSpec, input_mb: float) -> float:
    """Service time on an idle, healthy node (no contention, no noise)."""
    return app.place.overhead_ms + input_mb * ms_per_mb(app, node)


# app pairs that slow each other on one GPU beyond their resource demand (the seed's anti-affinity case:
# two FFT pipelines thrash the GPU's caches), per co-running task of the other app
INTERFERENCE: dict[frozenset[str], float] = {frozenset({"gCTF", "Motioncor2"}): 0.25}


def interference(a: str, b: str) -> float:
    return INTERFERENCE.get(frozenset({a, b}), 0.0) if a != b else INTERFERENCE.get(frozenset({a}), 0.0)


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
        on_cpu=None,
        tflops_ms=0.6, bw_ms=300.0, pcie_ms=1.0, gpu_mem_base_gb=0.5, gpu_mem_per_mb=0.01,
    ),
    "Motioncor2": AppProfile(
        "Motioncor2",
        on_gpu=Placement(8.0, 2.0, 4.0, 1, weights={"membw": 1.2, "gpu": 0.4, "pcie": 0.2},
                         demand={"gpu": 0.4, "membw": 0.6, "pcie": 0.2, "cpu": 2.0}, throttle_sensitive=True),
        on_cpu=None,
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
