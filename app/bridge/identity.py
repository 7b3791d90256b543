"""Which host answered a scrape: two exporters behind one address are two counters, not one.

A target's address can lead to more than one exporter -- a Service or load balancer alternating between two
pods, an address that moved to another node. Their counters are not one counter: a rate across two of their
pages is one host's value minus the other's (a huge rate, or a "reset" every other scrape). Each exporter
declares in the mapping (``identity``) what tells its host apart:

- labels: node_exporter's ``node_uname_info{nodename}``, dcgm-exporter's ``Hostname`` (``hostname`` on its
  master since upstream PR #655: either spelling is read, as one label) and ``UUID``,
  nvidia_gpu_exporter's ``nvidia_smi_gpu_info{uuid}``. Two pages are of other hosts when labels are on both
  and every one of them shares no value; a value shared by any label is the same host: a GPU left out of
  one scrape, a GPU's UUID on both pages whatever ``Hostname`` says (dcgm-exporter's ``Hostname`` is its
  container's or pod's name unless ``NODE_NAME`` is set, so it changes when the exporter restarts), the
  same ``Hostname`` with new UUIDs (a node whose GPUs were replaced);
- a boot time: node_exporter's ``node_boot_time_seconds``. Two boots are one when their boot times are within
  :data:`BOOT_TOLERANCE_S` (the kernel gives whole seconds) either as the pages give them or as instants on
  the bridge's clock (the scrape's time less the uptime the page gives against the exporter's own clock):
  the kernel derives its boot time from the wall clock, so a node whose clock was set still has the same
  boot on the bridge's clock, and a page delayed on its way has the same boot time as written. A node that
  rebooted is "another host" for that one interval, whose counters restarted anyway.

A part missing from a page tells nothing. :class:`HostWatch` follows one endpoint: a page of another host
than the previous page skips that interval's rates; a host that **comes back** (a page of a host seen in
the last :data:`HOSTS_MEMORY_S`, after another one) means two hosts answer the address, and the endpoint
answers as two hosts until :data:`HOSTS_MEMORY_S` after the last sign of it. Counters that go back and
forth (:mod:`app.bridge.rates`) twice within that time are such a sign too, for pages without identity.

>>> a = Identity("node_exporter", (("nodename", frozenset({"n1"})),), None, None)
>>> b = Identity("node_exporter", (("nodename", frozenset({"n2"})),), None, None)
>>> w = HostWatch()
>>> [w.observe(i, t) for t, i in enumerate((a, a, b, a))], w.two_hosts(3.0), w.hosts
([False, False, True, True], True, ('nodename=n2', 'nodename=n1'))
>>> def dcgm(hostname, *uuids):
...     return Identity("dcgm_exporter", (("Hostname", frozenset({hostname})), ("UUID", frozenset(uuids))), None, None)
>>> dcgm("dcgm-7f2c", "GPU-1").other_host(dcgm("dcgm-a91e", "GPU-1"))  # the exporter restarted
False
>>> dcgm("worker-3", "GPU-1").other_host(dcgm("worker-4", "GPU-2"))    # another node
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from app.bridge.exposition import Exposition
from app.bridge.mapping_types import ExporterSpec

BOOT_TOLERANCE_S = 5.0  # boot times this close are one boot (the kernel's are whole seconds)
HOSTS_MEMORY_S = 300.0  # hosts remembered this long; two hosts withheld until this long after the last sign
BOUNCES = 2  # counters back and forth this often within HOSTS_MEMORY_S: two hosts answer


@dataclasses.dataclass(frozen=True)
class Identity:
    """What one page says about the host that wrote it (an empty part, None: not on the page)."""

    exporter: str
    labels: tuple[tuple[str, frozenset[str]], ...]  # (label, its values on the page), in the mapping's order
    boot: float | None  # the boot time as the page gives it
    boot_bridge: float | None  # the boot as an instant on the bridge's clock (None: the page has no clock)

    def other_host(self, other: Identity) -> bool:
        """Whether ``other`` is certainly a page of another host."""
        if self.exporter != other.exporter:
            return True
        both = [(a, b) for (_, a), (_, b) in zip(self.labels, other.labels, strict=True) if a and b]
        if both and not any(a & b for a, b in both):
            return True
        if self.boot is None or other.boot is None or abs(self.boot - other.boot) <= BOOT_TOLERANCE_S:
            return False
        return self.boot_bridge is None or other.boot_bridge is None or abs(
            self.boot_bridge - other.boot_bridge) > BOOT_TOLERANCE_S

    def describe(self) -> str:
        parts = [f"{label}={','.join(sorted(values))}" for label, values in self.labels if values]
        if self.boot is not None:
            parts.append(f"booted at {self.boot:.0f}")
        return " ".join(parts) or f"{self.exporter} without identity"


def identify(spec: ExporterSpec, exposition: Exposition, bridge_t: float) -> Identity | None:
    """The identity a page gives per ``spec.identity`` / ``spec.boot``; None when the exporter declares none."""
    if not spec.identity and spec.boot is None:
        return None
    labels = tuple((spellings[0], frozenset(v for s in exposition.get(metric) if (v := _label(s.labels, spellings))))
                   for metric, spellings in spec.identity)
    boot_samples = exposition.get(spec.boot) if spec.boot else []
    boot = boot_samples[0].value if boot_samples else None
    clock = exposition.get(spec.clock) if spec.clock else []
    on_bridge = bridge_t - (clock[0].value - boot) if boot is not None and clock else None
    return Identity(spec.name, labels, boot, on_bridge)


def _label(labels: Mapping[str, str], spellings: tuple[str, ...]) -> str | None:
    """The value of the first spelling of a label that ``labels`` has (a non-empty one).

    >>> _label({"hostname": "worker-3"}, ("Hostname", "hostname")), _label({"UUID": ""}, ("UUID",))
    ('worker-3', None)
    """
    return next((labels[name] for name in spellings if labels.get(name)), None)


class HostWatch:
    """The hosts that answered one endpoint, and whether two of them take turns."""

    def __init__(self) -> None:
        self._last: Identity | None = None
        self._seen: list[tuple[Identity, float]] = []  # hosts answered in the last HOSTS_MEMORY_S, last seen
        self._bounces: list[float] = []
        self._sign_t: float | None = None  # the last sign of two hosts answering
        self.hosts: tuple[str, str] | None = None  # the last two hosts that took turns, described
        self.change: tuple[str, str] | None = None  # the last page's host and the one before, when they differ

    def observe(self, ident: Identity, t: float) -> bool:
        """Record the page read at bridge time ``t``; True when it is of another host than the previous one."""
        self._seen = [(i, s) for i, s in self._seen if t - s <= HOSTS_MEMORY_S]
        prev, self._last, self.change = self._last, ident, None
        if prev is not None and ident.other_host(prev):
            self.change = (prev.describe(), ident.describe())
            if any(not ident.other_host(i) for i, _ in self._seen):  # a host seen before came back
                self._sign_t, self.hosts = t, self.change
        self._seen = [(i, s) for i, s in self._seen if ident.other_host(i)] + [(ident, t)]
        return self.change is not None

    def bounced(self, t: float) -> None:
        """The endpoint's counters went back and forth at ``t`` (:attr:`app.bridge.rates.CounterTracker.bounces`)."""
        self._bounces = [b for b in self._bounces if t - b <= HOSTS_MEMORY_S] + [t]
        if len(self._bounces) >= BOUNCES:
            self._sign_t = t

    def two_hosts(self, t: float) -> bool:
        """Whether two hosts have been answering, as of bridge time ``t``."""
        return self._sign_t is not None and t - self._sign_t <= HOSTS_MEMORY_S
