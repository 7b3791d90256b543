"""Exporter trouble: readings that must not reach the model.

Four kinds, each withholding metric groups of the node's message (listed in its ``stale``):

``scrape_failed``
    the endpoint did not answer 200 with a valid exposition in time: every group of that exporter.
``collector_failed``
    the exporter answered but says its own collection failed -- node_exporter's
    ``node_scrape_collector_success{collector="cpu"} 0`` (cpu), ``...{collector="meminfo"} 0`` (memory);
    nvidia_gpu_exporter's ``nvidia_smi_command_exit_code`` != 0 (gpu). The checks are in ``mapping.yaml``.
``no_data``
    a GPU exporter answered, but none of its required metrics has a usable value (all blank, or absent --
    nvidia_gpu_exporter keeps answering 200 with only its failure counters when NVML is gone).
``watchdog_reset``
    GPU utilisation and GPU memory are both exactly 0 while the workload reports active CUDA streams: the
    driver watchdog reset the GPU (or NVML lost it); the zeros are not an idle GPU.

>>> from app.bridge.mapping import Watchdog
>>> wd = Watchdog("util", "mem", "streams", ("gpu",))
>>> watchdog_trouble({"util": 0.0, "mem": 0.0, "streams": 3.0}, wd, "dcgm_exporter").kind
'watchdog_reset'
>>> watchdog_trouble({"util": 0.0, "mem": 0.0, "streams": 0.0}, wd, "dcgm_exporter") is None   # idle
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from app.bridge.exposition import Exposition
from app.bridge.mapping import ExporterSpec, Watchdog

TROUBLE_KINDS = ("scrape_failed", "collector_failed", "no_data", "watchdog_reset")


@dataclasses.dataclass(frozen=True)
class Trouble:
    exporter: str
    kind: str
    groups: tuple[str, ...]
    detail: str = ""


def scrape_failed(exporter: str, spec: ExporterSpec | None, error: str) -> Trouble:
    return Trouble(exporter, "scrape_failed", spec.groups if spec else (), error)


def self_reported(spec: ExporterSpec, exposition: Exposition) -> list[Trouble]:
    """Troubles an exporter reports about itself, and required metrics without a usable value."""
    out: list[Trouble] = []
    for check in spec.health:
        for s in exposition.get(check.metric):
            if check.selects(s.labels) and s.value != check.ok:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out.append(Trouble(spec.name, "collector_failed", check.groups,
                                   f"{check.metric}{{{labels}}} = {s.value:g}, expected {check.ok:g}"))
    if spec.required and not any(exposition.get(name) for name in spec.required):
        out.append(Trouble(spec.name, "no_data", spec.groups, f"no usable value of {', '.join(spec.required)}"))
    return out


def watchdog_trouble(values: Mapping[str, float], wd: Watchdog, exporter: str) -> Trouble | None:
    """A watchdog reset, judged on the node's canonical values (all GPUs of the node at exactly zero)."""
    util, mem, active = values.get(wd.utilization), values.get(wd.memory), values.get(wd.activity)
    if util == 0.0 and mem == 0.0 and active is not None and active > 0:
        return Trouble(exporter, "watchdog_reset", wd.groups,
                       f"{wd.utilization} and {wd.memory} are 0 while {wd.activity} = {active:g}")
    return None
