"""Exporter trouble: readings that must not reach the model.

Seven kinds; all but ``gpu_lost`` withhold metric groups of the node's message (listed in its ``stale``):

``scrape_failed``
    the endpoint did not answer 200 with a valid exposition in time, or answered one without a sample of any
    metric the mapping reads (a landing page, an empty body): every group of that exporter; every group of
    the node's class when the exporter is neither declared nor known (see :mod:`app.bridge.snapshot`).
``collector_failed``
    the exporter answered but says its own collection failed -- node_exporter's
    ``node_scrape_collector_success{collector="cpu"} 0`` (cpu), ``...{collector="meminfo"} 0`` (memory);
    nvidia_gpu_exporter's ``nvidia_smi_command_exit_code`` != 0 (gpu). The checks are in ``mapping.yaml``.
``no_data``
    a GPU exporter answered, but none of its required metrics has a usable value (all blank, or absent --
    nvidia_gpu_exporter keeps answering 200 with only its failure counters when NVML is gone).
``watchdog_reset``, ``gpu_hang``
    the GPU reads as idle while work is on it: see :mod:`app.bridge.gpu_hang`.
``two_hosts``
    two hosts answer the endpoint's address in turn (a Service or load balancer in front of two exporters):
    a host seen before came back after another one, or counters went back and forth, within the last
    :data:`~app.bridge.identity.HOSTS_MEMORY_S`: every group of that exporter, since any of its pages may be
    another node's (see :mod:`app.bridge.identity`).
``gpu_lost``
    one GPU of the node is gone from its exporter's page, or reported a fatal Xid: one trouble per GPU (its
    ``subject`` is the GPU's UUID), withholding nothing -- the other GPUs' readings are valid, and the lost
    one has none left on the page (see :mod:`app.bridge.gpu_lost`).
"""

from __future__ import annotations

import dataclasses

from app.bridge.exposition import Exposition
from app.bridge.mapping_types import ExporterSpec

TROUBLE_KINDS = ("scrape_failed", "collector_failed", "no_data", "watchdog_reset", "gpu_hang", "two_hosts",
                 "gpu_lost")


@dataclasses.dataclass(frozen=True)
class Trouble:
    """One trouble of one scrape. ``groups``: withheld (may be none); ``subject``: what of the exporter is in
    trouble when there can be several at once (a GPU's UUID), so that each starts and clears on its own."""

    exporter: str
    kind: str
    groups: tuple[str, ...]
    detail: str = ""
    subject: str = ""


def scrape_failed(exporter: str, spec: ExporterSpec | None, error: str) -> Trouble:
    return Trouble(exporter, "scrape_failed", spec.groups if spec else (), error)


def two_hosts(exporter: str, spec: ExporterSpec | None, url: str, hosts: tuple[str, str] | None) -> Trouble:
    """``url`` answers as two hosts (``hosts``: the last two seen taking turns; None: counters said so)."""
    seen = f"({hosts[0]}; {hosts[1]})" if hosts else "(its counters went back and forth)"
    return Trouble(exporter, "two_hosts", spec.groups if spec else (), f"target {url} answered as two hosts {seen}")


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
