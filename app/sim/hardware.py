"""Simulated nodes: their hardware and the two cluster presets.

GPU figures come from the shared catalogue :data:`app.features.hardware.GPUS`, so the simulator and the
models describe a GPU the same way. A GPU node time-slices each GPU into ``gpu_slots`` shares (the NVIDIA
device plugin's time-slicing replicas): at most that many GPU tasks run on one GPU at a time.

>>> nodes = small_preset()
>>> [n.name for n in nodes if n.node_class == "gpu"]
['worker-1', 'worker-2', 'worker-3']
>>> nodes[2].gpu.model, nodes[2].gpu.mem_gb
('RTX 4090', 24.0)
>>> len(large_preset(300)), sum(n.node_class == "gpu" for n in large_preset(300)) > 100
(300, True)
"""

from __future__ import annotations

import dataclasses

from app.features.hardware import GpuSpec, gpu_spec, hardware_features

PCIE_GBS = {2: 8.0, 3: 15.75, 4: 31.5}  # x16 link, GB/s per direction


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One node's hardware. ``join_at_s`` > 0: the node joins the cluster that many seconds into the run."""

    name: str
    node_class: str  # "gpu" | "cpu"
    cpu_cores: int
    mem_gb: float
    disk_mb_s: float  # sequential read bandwidth, MB/s
    gpu: GpuSpec | None = None
    gpu_count: int = 0
    gpu_slots: int = 4  # concurrent GPU tasks per GPU
    join_at_s: float = 0.0

    def __post_init__(self) -> None:
        if self.node_class not in ("gpu", "cpu"):
            raise ValueError(f"NodeSpec.node_class: must be 'gpu' or 'cpu' (got {self.node_class!r})")
        if (self.node_class == "gpu") != (self.gpu is not None and self.gpu_count > 0):
            raise ValueError(f"NodeSpec.gpu: a gpu node needs a GPU and gpu_count > 0 ({self.name})")
        if self.cpu_cores <= 0 or self.mem_gb <= 0 or self.disk_mb_s <= 0:
            raise ValueError(f"NodeSpec: cpu_cores, mem_gb and disk_mb_s must be > 0 ({self.name})")
        if self.gpu_slots <= 0:
            raise ValueError(f"NodeSpec.gpu_slots: must be > 0 ({self.name})")

    @property
    def gpu_model(self) -> str | None:
        return self.gpu.model if self.gpu else None

    @property
    def gpu_shares(self) -> int:
        return self.gpu_count * self.gpu_slots

    @property
    def pcie_gbs(self) -> float:
        """Host-to-device bandwidth; CPU nodes copy through host memory (modelled as a PCIe 3 link)."""
        return PCIE_GBS[self.gpu.pcie_gen] if self.gpu else PCIE_GBS[3]

    def hardware_features(self) -> dict[str, float]:
        return hardware_features(self.node_class, self.gpu_model, cpu_cores=self.cpu_cores,
                                 gpu_count=self.gpu_count or None)


def _gpu(model: str) -> GpuSpec:
    spec = gpu_spec(model)
    if spec is None:
        raise ValueError(f"unknown GPU model {model!r}: add it to app.features.hardware.GPUS")
    return spec


def gpu_node(name: str, model: str, *, count: int = 1, cores: int = 16, mem_gb: float = 64.0,
             disk_mb_s: float = 500.0, join_at_s: float = 0.0) -> NodeSpec:
    return NodeSpec(name, "gpu", cores, mem_gb, disk_mb_s, _gpu(model), count, join_at_s=join_at_s)


def cpu_node(name: str, *, cores: int = 32, mem_gb: float = 128.0, disk_mb_s: float = 400.0,
             join_at_s: float = 0.0) -> NodeSpec:
    return NodeSpec(name, "cpu", cores, mem_gb, disk_mb_s, join_at_s=join_at_s)


def small_preset() -> list[NodeSpec]:
    """The seed's cluster: Worker-1..3 with one K20c, M40, RTX 4090 each, plus three CPU nodes."""
    return [
        gpu_node("worker-1", "Tesla K20c", cores=8, mem_gb=32.0, disk_mb_s=300.0),
        gpu_node("worker-2", "Tesla M40", cores=12, mem_gb=64.0, disk_mb_s=450.0),
        gpu_node("worker-3", "RTX 4090", cores=16, mem_gb=64.0, disk_mb_s=1500.0),
        cpu_node("cpu-1", cores=32, disk_mb_s=400.0),
        cpu_node("cpu-2", cores=32, disk_mb_s=400.0),
        cpu_node("cpu-3", cores=16, mem_gb=64.0, disk_mb_s=250.0),
    ]


def large_preset(n_nodes: int = 300) -> list[NodeSpec]:
    """``n_nodes`` nodes: 40 % GPU nodes (K20c, M40, M40 24GB, RTX 4090 in rotation), the rest CPU-only."""
    if n_nodes < 4:
        raise ValueError(f"large_preset.n_nodes: must be >= 4 (got {n_nodes})")
    models = ("Tesla K20c", "Tesla M40", "Tesla M40 24GB", "RTX 4090")
    disks = {"Tesla K20c": 300.0, "Tesla M40": 450.0, "Tesla M40 24GB": 450.0, "RTX 4090": 1500.0}
    out: list[NodeSpec] = []
    n_gpu = max(1, int(n_nodes * 0.4))
    for i in range(n_gpu):
        model = models[i % len(models)]
        out.append(gpu_node(f"gpu-{i + 1:03d}", model, count=1 + (i // len(models)) % 2, disk_mb_s=disks[model]))
    for i in range(n_nodes - n_gpu):
        out.append(cpu_node(f"cpu-{i + 1:03d}", cores=(32, 16, 64)[i % 3], disk_mb_s=(400.0, 250.0, 600.0)[i % 3]))
    return out


def preset(name: str, n_nodes: int | None = None) -> list[NodeSpec]:
    """A preset by name: ``small`` or ``large`` (``n_nodes`` applies to ``large``)."""
    if name == "small":
        return small_preset()
    if name == "large":
        return large_preset(300 if n_nodes is None else n_nodes)
    raise ValueError(f"preset: must be 'small' or 'large' (got {name!r})")
