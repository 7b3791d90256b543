"""Has a node lost a GPU? One gone from its exporter's page, or one that reported a fatal Xid.

A GPU that falls off the bus (Xid 79) or hits a fatal error only lowers the node's ``gpu_count``: it vanishes
from the page (dcgm-exporter skips blank values; nvidia-smi lists the GPUs it reaches), or its values go
blank and are dropped. A :class:`GpuWatch` follows the GPUs one endpoint's pages list, by UUID (which label
holds it, per exporter: the mapping's ``gpu_lost``), and reports each lost one as a ``gpu_lost`` trouble
naming it (index, UUID, model) and why:

- **missing**: a GPU listed with a reading on the pages for ``known_after_s`` that a page of its exporter
  lists no more with a reading -- "missing from the page since <time>" (or "no reading since", when only its
  Xid gauge is left). A page that did not come (``scrape_failed``), one whose exporter says its collection
  failed (``collector_failed``: nvidia-smi failed, and nvidia_gpu_exporter lists no GPU then) and one that may
  be another host's (``two_hosts``) tell nothing: the GPUs lost as of the last page that told are reported
  again. A page of another host than the previous one (:mod:`app.bridge.identity`: an address that moved to
  another node) starts the memory afresh, unless it lists a GPU remembered: that is the same machine. A GPU
  replaced -- its index now held by a GPU never listed before -- is forgotten at once (a node whose page has no
  other value to share, nvidia_gpu_exporter's with one GPU, is another host's anyway); one removed is missing
  until forgotten.
- **a fatal Xid**: the GPU's gauge of its last Xid (dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS``) holds one of
  :data:`FATAL_XIDS` -- "Xid 79: fallen off the bus", at once. The gauge keeps the last Xid until DCGM or the
  exporter restarts, so after a reset of the GPU its exporter must be restarted too.

It clears when the GPU is listed again with a reading and without a fatal Xid (the gauge back to 0, or an
application's Xid). A GPU replaced, or missing for ``forget_after_s`` (the node was drained and the GPU
removed), is forgotten: listed in :attr:`GpuWatch.forgotten` for the log, then no longer reported. The trouble
withholds nothing: the other GPUs' readings are valid, and the lost GPU has none left to publish.

>>> from app.bridge.exposition import parse_exposition
>>> from app.bridge.mapping_types import GpuLabels, GpuLoss
>>> dcgm = GpuLabels("UUID", "gpu", "modelName", "DCGM_FI_DEV_XID_ERRORS")
>>> w = GpuWatch("dcgm_exporter", dcgm, GpuLoss({"dcgm_exporter": dcgm}, 30.0, 3600.0))
>>> def page(*xids):  # one line of utilisation and one of the last Xid per GPU: GPU i's last Xid is xids[i]
...     gpu = '{gpu="%d",UUID="GPU-%d",modelName="A100"}'
...     return parse_exposition("".join(f"DCGM_FI_DEV_GPU_UTIL{gpu % (i, i)} 50\\n"
...                                     f"DCGM_FI_DEV_XID_ERRORS{gpu % (i, i)} {x}\\n" for i, x in xids))
>>> [w.observe(page((0, 0), (1, 0)), t) for t in (0.0, 30.0)]      # two GPUs, known after 30 s
[(), ()]
>>> [t.detail for t in w.observe(page((0, 0)), 31.0)]
['GPU 1, UUID GPU-1, A100: missing from the page since 1970-01-01T00:00:31Z']
>>> [t.detail for t in w.observe(page((0, 79), (1, 0)), 32.0)]     # GPU 1 back; GPU 0 fell off the bus
['GPU 0, UUID GPU-0, A100: Xid 79: fallen off the bus']
>>> w.observe(page((0, 13), (1, 0)), 33.0)                         # an application's Xid: the GPU is fine
()
"""

from __future__ import annotations

import dataclasses
import datetime

from app.bridge.exposition import Exposition
from app.bridge.health import Trouble
from app.bridge.mapping_types import GpuLabels, GpuLoss

# Xids after which the GPU takes no work until it is reset (or the node rebooted): those whose "Resolution
# Bucket (Immediate Action)" in NVIDIA's Xid catalog is RESET_GPU, RESTART_BM (reboot the node) or a hardware
# workflow (double-bit ECC, NVLink) -- https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
# as NVIDIA/NVSentinel's xiderrorsmapping.csv carries it. Not in it: the catalog's RESTART_APP and IGNORE
# Xids -- an application's fault the GPU recovers from (13, 31, 43, 45, ...) and Xid 94, a contained ECC
# error (the application that met it is stopped, the GPU goes on) -- nor the Xids the catalog marks unused.
FATAL_XIDS: dict[int, str] = {
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "fallen off the bus",
    95: "uncontained ECC error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "link training failure",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    **{x: "NVLink error" for x in range(144, 151)},
    155: "NVLink error",
    156: "resource retirement",
    158: "fatal timeout",
    160: "channel retirement",
}

_LABEL_CHARS = 128  # a label value quoted in a detail is cut to this length


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fatal_xid(value: float) -> int | None:
    """The Xid a gauge's ``value`` holds when it is one of :data:`FATAL_XIDS`, else None."""
    xid = int(value) if value.is_integer() else None
    return xid if xid in FATAL_XIDS else None


@dataclasses.dataclass
class _Gpu:
    first_seen: float  # the first page of the current run of pages that listed it with a reading
    index: str | None = None
    model: str | None = None
    known: bool = False  # listed with a reading for known_after_s: from then on its absence is a loss
    missing_since: float | None = None

    def describe(self, uuid: str) -> str:
        parts = (f"GPU {self.index}" if self.index else "GPU", f"UUID {uuid[:_LABEL_CHARS]}", self.model)
        return ", ".join(p for p in parts if p)


@dataclasses.dataclass
class _Page:
    """What one page says of the GPUs it lists."""

    labels: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # UUID -> describing labels
    reading: set[str] = dataclasses.field(default_factory=set)  # UUIDs with a reading other than the Xid gauge
    xids: dict[str, int] = dataclasses.field(default_factory=dict)  # UUID -> the fatal Xid its gauge holds


class GpuWatch:
    """The GPUs one endpoint's pages list, and which of them are lost."""

    def __init__(self, exporter: str, labels: GpuLabels, loss: GpuLoss) -> None:
        self.exporter = exporter
        self.labels = labels
        self.loss = loss
        self._gpus: dict[str, _Gpu] = {}  # by UUID, in the order the pages first listed them
        self.lost: tuple[Trouble, ...] = ()  # as of the last page that told
        self.forgotten: tuple[Trouble, ...] = ()  # by the last call, each detail saying so

    def host_changed(self, exposition: Exposition) -> None:
        """``exposition`` is of another host than the previous page: the GPUs remembered are forgotten when none
        of them is on it (they are not this host's); one still listed is this machine, and all are kept."""
        if not self._gpus.keys() & self._read(exposition).labels.keys():
            self._gpus.clear()
            self.lost = self.forgotten = ()

    def repeat(self) -> tuple[Trouble, ...]:
        """For a round whose page tells nothing of the GPUs: those lost as of the last page that told."""
        self.forgotten = ()
        return self.lost

    def _read(self, exposition: Exposition) -> _Page:
        lb, page = self.labels, _Page()
        for name, samples in exposition.samples.items():
            for s in samples:
                uuid = s.labels.get(lb.uuid)
                if not uuid:
                    continue
                info = page.labels.setdefault(uuid, {})
                for label in (lb.index, lb.model):
                    if label and s.labels.get(label):
                        info.setdefault(label, s.labels[label][:_LABEL_CHARS])
                if name != lb.xid:
                    page.reading.add(uuid)
                elif (xid := fatal_xid(s.value)) is not None:
                    page.xids[uuid] = xid
        return page

    def observe(self, exposition: Exposition, ts: float) -> tuple[Trouble, ...]:
        """The GPUs lost as of this page of the exporter, read at wall-clock ``ts``; one trouble each."""
        page, loss, forgotten = self._read(exposition), self.loss, []
        new = [u for u in page.reading if u not in self._gpus]  # GPUs this host's pages never listed before
        for uuid in [*self._gpus, *(u for u in page.labels if u not in self._gpus)]:
            gpu = self._gpus.get(uuid)
            if gpu is None:
                if uuid not in page.reading and uuid not in page.xids:
                    continue  # only a harmless Xid gauge: nothing to follow
                gpu = self._gpus[uuid] = _Gpu(ts)
            info = page.labels.get(uuid, {})
            gpu.index = info.get(self.labels.index or "", gpu.index)
            gpu.model = info.get(self.labels.model or "", gpu.model)
            if uuid in page.reading:
                gpu.missing_since = None
                gpu.known = gpu.known or ts - gpu.first_seen >= loss.known_after_s
            elif not gpu.known:
                if uuid not in page.xids:  # seen too briefly to be missed: forgotten quietly
                    del self._gpus[uuid]
            elif gpu.missing_since is None:
                gpu.missing_since = ts
            elif ts - gpu.missing_since >= loss.forget_after_s and uuid not in page.labels:
                del self._gpus[uuid]
                forgotten.append(Trouble(
                    self.exporter, "gpu_lost", (), f"{gpu.describe(uuid)}: missing from the page since "
                    f"{_when(gpu.missing_since)}, forgotten after {loss.forget_after_s / 60:g} min (the node "
                    "drained and the GPU replaced or removed?): no longer reported", uuid))
        forgotten += self._replaced(page, new)
        self.forgotten = tuple(forgotten)
        self.lost = tuple(self._lost(page))
        return self.lost

    def _replaced(self, page: _Page, new: list[str]) -> list[Trouble]:
        """Forget each missing GPU whose index a GPU never listed before now holds: the node was drained and the
        GPU replaced (a GPU lost from a running node leaves its index empty, or to a GPU already known when the
        driver numbers the rest again)."""
        at = {idx: u for u in new if (idx := page.labels[u].get(self.labels.index or ""))}
        out = []
        for uuid, gpu in list(self._gpus.items()):
            if gpu.missing_since is not None and uuid not in page.labels and gpu.index in at:
                del self._gpus[uuid]
                out.append(Trouble(
                    self.exporter, "gpu_lost", (), f"{gpu.describe(uuid)}: missing from the page since "
                    f"{_when(gpu.missing_since)}, replaced by UUID {at[gpu.index]} at its index: no longer reported",
                    uuid))
        return out

    def _lost(self, page: _Page) -> list[Trouble]:
        out = []
        for uuid, gpu in self._gpus.items():
            why = [f"Xid {page.xids[uuid]}: {FATAL_XIDS[page.xids[uuid]]}"] if uuid in page.xids else []
            if gpu.missing_since is not None:
                listed = "no reading" if uuid in page.labels else "missing from the page"
                why.append(f"{listed} since {_when(gpu.missing_since)}")
            if why:
                out.append(Trouble(self.exporter, "gpu_lost", (), f"{gpu.describe(uuid)}: {'; '.join(why)}", uuid))
        return out
