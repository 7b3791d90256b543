"""Exporter-like scrapes of a simulated node: canonical metric names, units as the bridge emits them, noise.

Every name is a canonical metric of ``app/bridge/mapping.yaml`` in its unit there (a test checks the names),
so a model trained in the simulator reads live node-metrics the same way.

One scrape is one node-metrics message (``topics/node-metrics.json``). Utilisations and rates are means
over the scrape interval (what counters turned into rates show); gauges (memory used, active CUDA
streams) read the node at scrape time. Readings carry multiplicative or additive noise like real
exporters (sampling jitter, rounding); ``cuda_stream_active`` is a count and is exact. CPU nodes have
no GPU metrics at all.

>>> import numpy as np
>>> from app.sim.hardware import small_preset
>>> from app.sim.state import NodeRuntime
>>> msg = scrape_message(NodeRuntime(small_preset()[2], 2), np.random.default_rng(0), now=1.0, ts=1.7e9)
>>> msg["node"], msg["node_class"], msg["gpu_model"]
('worker-3', 'gpu', 'RTX 4090')
>>> sorted(msg["metrics"]) == sorted(GPU_METRICS + HOST_METRICS)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.sim.state import NodeRuntime

GIB = float(1 << 30)
GPU_METRICS = (
    "nvidia_smi_utilization_gpu",  # 0..1
    "nvidia_smi_memory_used",  # bytes
    "cuda_stream_active",  # count
    "gpu_temperature",  # degrees C
    "gpu_sm_clock_mhz",  # MHz
    "pcie_rx_bytes",  # B/s
    "pcie_tx_bytes",  # B/s
    "gpu_count",  # GPUs (the bridge's gauge of the GPU exporter's distinct ``gpu`` labels)
)
HOST_METRICS = (
    "cpu_usage_user", "cpu_usage_system", "cpu_iowait", "cpu_idle",  # fractions of all cores
    "memory_cache_usage", "memory_used_fraction",  # fractions of the node's memory
    "disk_read_bytes_per_s", "disk_written_bytes_per_s",  # B/s
    "cpu_count",  # cores (the bridge's gauge of node_exporter's distinct ``cpu`` labels)
)
ALL_METRICS = GPU_METRICS + HOST_METRICS
SM_CLOCK_MHZ = {"Tesla K20c": 706.0, "Tesla M40": 1114.0, "Tesla M40 24GB": 1114.0, "RTX 4090": 2520.0}


def _clip01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def scrape(rt: NodeRuntime, rng: np.random.Generator, now: float) -> dict[str, float]:
    """All metrics of one node at ``now`` (rates over the interval since its previous scrape), with noise."""
    z = rng.standard_normal(12)
    d = rt.interval_demand(now)
    bg = rt.cond.background
    spec = rt.spec
    g = float(max(spec.gpu_count, 1))
    out: dict[str, float] = {}
    pcie = (d["pcie"] + bg.get("pcie", 0.0)) * spec.pcie_gbs * 1e9 * 0.5 * (1.0 + 0.05 * z[0])
    if spec.node_class == "gpu":
        util = min(1.0, (d["gpu"] + bg.get("gpu", 0.0)) / g)
        out["nvidia_smi_utilization_gpu"] = _clip01(util + 0.02 * z[1])
        used_gb = 0.3 + rt.gpu_mem_used + 2.0 * bg.get("membw", 0.0)
        out["nvidia_smi_memory_used"] = max(0.0, used_gb * GIB * (1.0 + 0.005 * z[2]))
        out["cuda_stream_active"] = float(rt.gpu_tasks + round(2 * bg.get("gpu", 0.0)))
        hot = 10.0 if rt.cond.throttle > 1.0 else 0.0
        out["gpu_temperature"] = 35.0 + 45.0 * util + hot + z[3]
        clock = SM_CLOCK_MHZ.get(spec.gpu_model or "", 1000.0)
        out["gpu_sm_clock_mhz"] = max(0.0, clock / rt.cond.throttle + 5.0 * z[4])
        out["pcie_rx_bytes"] = max(0.0, pcie)
        out["pcie_tx_bytes"] = max(0.0, 0.3 * pcie)
        out["gpu_count"] = float(spec.gpu_count)
    cpu = (d["cpu"] + bg.get("cpu", 0.0)) / spec.cpu_cores
    disk = d["disk"] + bg.get("disk", 0.0)
    user = _clip01(0.85 * cpu + 0.01 * z[5])
    system = _clip01(0.01 + 0.15 * cpu + 0.003 * z[6])
    iowait = _clip01(min(0.5, 0.3 * disk) + 0.005 * z[7])
    out["cpu_usage_user"] = user
    out["cpu_usage_system"] = system
    out["cpu_iowait"] = iowait
    out["cpu_idle"] = _clip01(1.0 - user - system - iowait)
    cached_gb = (2.0 + 0.5 * rt.mem_used + 4.0 * disk) * (1.0 + 0.01 * z[8])
    out["memory_cache_usage"] = _clip01(cached_gb / spec.mem_gb)
    out["memory_used_fraction"] = _clip01((4.0 + rt.mem_used) * (1.0 + 0.002 * z[9]) / spec.mem_gb)
    read = disk * spec.disk_mb_s * 1e6 * (1.0 + 0.05 * z[10])
    out["disk_read_bytes_per_s"] = max(0.0, read)
    out["disk_written_bytes_per_s"] = max(0.0, 0.2 * read * (1.0 + 0.05 * z[11]))
    out["cpu_count"] = float(spec.cpu_cores)
    return out


def scrape_message(rt: NodeRuntime, rng: np.random.Generator, now: float, ts: float) -> dict[str, Any]:
    """One node-metrics message value (see ``topics/node-metrics.json``)."""
    return {
        "node": rt.name,
        "ts": ts,
        "node_class": rt.spec.node_class,
        "gpu_model": rt.spec.gpu_model,
        "metrics": scrape(rt, rng, now),
    }
