"""Is a node's GPU hung? Two checks on its canonical metrics, neither needing a custom exporter.

``watchdog_reset`` (at once)
    utilisation and GPU memory both exactly 0 while an *activity count* is > 0. A CUDA context holds
    memory, so processes or streams on a GPU with no memory in use mean the driver watchdog reset it (or
    NVML lost it): the zeros are not an idle GPU. The counts: ``cuda_stream_active`` (the task runtime's
    optional ``rtt_cuda_streams_active`` gauge) and ``gpu_compute_processes`` (nvidia_gpu_exporter >= 1.9.0
    with ``--collect.compute-apps``).
``gpu_hang`` (after ``flat_for_s``)
    utilisation and memory activity (``gpu_memory_copy_util``) flat at exactly 0 for ``flat_for_s`` while
    work is assigned to the GPU: an activity count > 0, or pods of GPU apps running on the node according
    to the running-pods view ``rttsched pods`` keeps in Redis (:mod:`app.bridge.running`). This is what a
    stock deployment has (dcgm-exporter or nvidia_gpu_exporter, no custom gauge). A task's phase without
    GPU work (reading its input) is shorter than the default 30 s; set it longer if yours are not.

The check is per node: all GPUs of the node at zero (utilisation is their mean), so a reset of one GPU among
several is not caught. Each :class:`GpuHangCheck` holds one node's state; time is the scrape's timestamp.

>>> from app.bridge.mapping_types import Watchdog
>>> wd = Watchdog("util", "mem", "copy", ("streams",), 30.0, ("gpu",))
>>> check = GpuHangCheck(wd)
>>> check.observe({"util": 0.0, "mem": 0.0, "streams": 3.0}, 0.0, None, "dcgm_exporter").kind
'watchdog_reset'
>>> idle = {"util": 0.0, "mem": 2.0e9, "copy": 0.0}
>>> [check.observe(idle, t, 2, "dcgm_exporter") for t in (100.0, 120.0)]     # 2 GPU pods, flat for 20 s
[None, None]
>>> check.observe(idle, 130.0, 2, "dcgm_exporter").kind
'gpu_hang'
>>> check.observe(idle, 131.0, 0, "dcgm_exporter") is None                  # no pod left: an idle GPU
True
"""

from __future__ import annotations

from collections.abc import Mapping

from app.bridge.health import Trouble
from app.bridge.mapping_types import Watchdog


class GpuHangCheck:
    """The GPU checks of one node, with the time its GPU went flat."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.flat_since: float | None = None

    def _activity(self, values: Mapping[str, float]) -> tuple[float, str] | None:
        counts = [(values[a], a) for a in self.watchdog.activity if a in values]
        return max(counts) if counts else None

    def observe(self, values: Mapping[str, float], ts: float, gpu_pods: int | None,
                exporter: str) -> Trouble | None:
        """The trouble this scrape shows, if any.

        ``values``: the node's canonical values; ``gpu_pods``: pods of GPU apps running on the node per
        the running-pods view (None: no view).
        """
        wd = self.watchdog
        util = values.get(wd.utilization)
        if util is None:
            self.flat_since = None
            return None
        activity = self._activity(values)
        if util == 0.0 and values.get(wd.memory) == 0.0 and activity is not None and activity[0] > 0:
            return Trouble(exporter, "watchdog_reset", wd.groups,
                           f"{wd.utilization} and {wd.memory} are 0 while {activity[1]} = {activity[0]:g}")
        copy = values.get(wd.memory_activity) if wd.memory_activity else None
        flat = util == 0.0 and (copy is None or copy == 0.0)
        if activity is not None and activity[0] > 0:
            work = f"{activity[1]} = {activity[0]:g}"
        elif gpu_pods:
            work = f"{gpu_pods} pod(s) of GPU apps run on the node"
        else:
            work = ""
        if not (flat and work):
            self.flat_since = None
            return None
        if self.flat_since is None:
            self.flat_since = ts
        flat_s = ts - self.flat_since
        if flat_s < wd.flat_for_s:
            return None
        what = wd.utilization + (f" and {wd.memory_activity}" if copy is not None else "")
        return Trouble(exporter, "gpu_hang", wd.groups, f"{what} flat at 0 for {flat_s:.0f}s while {work}")
