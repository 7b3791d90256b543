"""Monotone constraints: which way a task's time may move as a feature grows, for XGBoost.

RTT models are asked to rank nodes the data has seen in few states: the fastest GPU is also the busiest
one, so a free tree can read "busy" as "fast". Some directions hold whatever the data: a larger input,
more pods beside the task and more load on a shared resource never make a task faster, and on a GPU
node a faster GPU, or more GPUs for the node's pods to share, never makes a GPU app slower.
:func:`monotone_constraints` turns them into XGBoost's ``monotone_constraints`` (``{name: +1 | -1}``);
:func:`app.trainer.pipeline.train_challenger` passes them to every model it trains.

>>> [direction(n, True) for n in ("task_input_size_mb", "running_pods_gCTF", "hw_gpu_fp32_tflops", "hw_gpu_count")]
[1, 1, -1, -1]
>>> direction("hw_gpu_fp32_tflops", False), direction("cpu_iowait__mean", True), direction("cpu_idle__std", True)
(0, 1, 0)
>>> monotone_constraints(["task_input_size_mb", "cpu_idle__mean", "pcie_rx_bytes__std"], gpu_app=False)
{'task_input_size_mb': 1, 'cpu_idle__mean': -1}
"""

from __future__ import annotations

from collections.abc import Sequence

from app.features.vector import RUNNING_PREFIX, TASK_FEATURES, split_feature_name

# a faster GPU, or more of them on the node (the pods of a node share its GPUs)
GPU_SPEED = frozenset({"hw_gpu_fp32_tflops", "hw_gpu_mem_bw_gbs", "hw_pcie_gen", "gpu_sm_clock_mhz", "hw_gpu_count",
                       "gpu_count"})
# load on a shared resource (canonical names, app/bridge/canonical.py): more of it never makes a task
# faster; idle time is the opposite
LOAD_METRICS = frozenset({
    "nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "gpu_temperature",
    "pcie_rx_bytes", "pcie_tx_bytes", "cpu_usage_user", "cpu_usage_system", "cpu_iowait", "memory_cache_usage",
    "memory_used_fraction", "disk_read_bytes_per_s", "disk_written_bytes_per_s",
})
IDLE_METRICS = frozenset({"cpu_idle"})
LEVELS = frozenset({"mean", "min", "max", "last"})  # aggregates that move with the level (not ``std``)


def direction(name: str, gpu_app: bool) -> int:
    """How a task's time may move as feature ``name`` grows: +1 never faster, -1 never slower, 0 free.

    Larger inputs, more pods beside the task and more load on any shared resource never make it faster
    (level aggregates of load metrics; their ``std`` is free); for an app that runs on the GPU, a faster
    GPU (FP32 throughput, memory bandwidth, PCIe generation, SM clock) or more GPUs on the node never slow it.
    """
    if name in TASK_FEATURES or name.startswith(RUNNING_PREFIX):
        return 1
    metric, agg = split_feature_name(name)
    if not agg:
        return -1 if gpu_app and name in GPU_SPEED else 0
    if agg not in LEVELS:
        return 0
    if metric in LOAD_METRICS:
        return 1
    if metric in IDLE_METRICS:
        return -1
    return -1 if gpu_app and metric in GPU_SPEED else 0


def monotone_constraints(names: Sequence[str], gpu_app: bool) -> dict[str, int]:
    """XGBoost's ``monotone_constraints`` for a model over ``names`` (only the constrained ones)."""
    return {n: d for n in names if (d := direction(n, gpu_app))}
