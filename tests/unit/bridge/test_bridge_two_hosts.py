"""Two exporters behind one address: no rate across two hosts' pages, and a target that alternates is withheld.

Host ``a`` is the real node_exporter 1.5.0 capture (nodename ``vm``); host ``b`` the same capture as another VM
would give it: nodename ``vm-2``, booted a day earlier, its disk and context-switch counters further on.
Pages are read ``GAP_S`` apart on both clocks (the bridge's and the exporters').
"""

from __future__ import annotations

import logging

import pytest
from bridge_fixtures import (
    DCGM_A,
    DCGM_B,
    DCGM_URL,
    GAP_S,
    NODE_A,
    NODE_B,
    NODE_URL,
    NVIDIA_A,
    NVIDIA_URL,
    ExporterServer,
    assembler,
    ok,
    raw_sum,
    with_value,
)
from prometheus_client import CollectorRegistry

from app.bridge.identity import HOSTS_MEMORY_S
from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.clock import ManualClock
from app.config import Settings

T_B = raw_sum(NODE_B, "node_time_seconds")
BOOT = raw_sum(NODE_B, "node_boot_time_seconds")
VDA = 'node_disk_read_bytes_total{device="vda"}'
CTX = "node_context_switches_total"
READ_RATE = 1000.0  # bytes/s host a's vda reads between its pages
B_AHEAD = 4.2e9  # bytes host b's vda has read more than a's: 5e8 B/s over one gap, a plausible disk rate
NODE_GROUPS = ["cpu", "memory", "node"]
HOST_A = f"nodename=vm booted at {BOOT:.0f}"
HOST_B = f"nodename=vm-2 booted at {BOOT - 86400:.0f}"


def page(k: int, host: str = "a") -> str:
    """The page ``host`` answers ``k`` gaps after scrape-b: its clock ``k * GAP_S`` on, vda ``READ_RATE`` B/s."""
    text = with_value(NODE_B.read_text(), "node_time_seconds", T_B + k * GAP_S)
    read = raw_sum(NODE_B, "node_disk_read_bytes_total", device="vda") + k * GAP_S * READ_RATE
    switches = raw_sum(NODE_B, CTX)
    if host == "b":
        text = with_value(text.replace('nodename="vm"', 'nodename="vm-2"'), "node_boot_time_seconds", BOOT - 86400)
        read, switches = read + B_AHEAD, switches + 1e6
    return with_value(with_value(text, VDA, read), CTX, switches)


def without_identity(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines()
                   if not line.startswith(("node_uname_info", "node_boot_time_seconds")))


def every_counter_ahead(text: str, by: float = 1e6) -> str:
    """The page of a host whose every counter is ``by`` further on (another machine's counters all differ)."""
    out = []
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if not line.startswith("#") and name.split("{")[0].endswith("_total"):
            line = f"{name} {float(value) + by!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def scrapes(hosts: str, make=page, url: str = NODE_URL) -> list[Snapshot]:
    """One node scraped through ``url`` once per letter of ``hosts`` (the host answering), ``GAP_S`` apart."""
    a = assembler(url)
    return [a.assemble([ok(url, make(k, h), k * GAP_S)], 1000.0 + k * GAP_S) for k, h in enumerate(hosts)]


def reasons(snap: Snapshot) -> list[str]:
    return [s.reason for s in snap.skips]


def kinds(snap: Snapshot) -> list[str]:
    return [t.kind for t in snap.troubles]


def test_two_hosts_in_turn_give_no_rate_across_them_and_the_target_is_withheld():
    snaps = scrapes("ababab")
    assert all("disk_read_bytes_per_s" not in s.message["metrics"] for s in snaps)  # never b's bytes less a's
    assert all(reasons(s) == ["host_changed"] for s in snaps[1:])  # no "reset" every other scrape
    first = snaps[1].skips[0]
    assert first.url == NODE_URL and first.detail == f"answered as {HOST_B}, the previous page as {HOST_A}"
    assert snaps[1].troubles == ()  # one change alone: a node that moved, or rebooted
    for s in snaps[2:]:  # a came back: two hosts answer the address
        assert kinds(s) == ["two_hosts"] and s.troubles[0].groups == tuple(NODE_GROUPS)
        assert s.message["metrics"] == {} and s.message["stale"] == NODE_GROUPS
    assert snaps[2].troubles[0].detail == f"target {NODE_URL} answered as two hosts ({HOST_B}; {HOST_A})"


def test_a_target_that_alternates_publishes_nothing_fresh_until_the_other_host_is_gone_for_a_while():
    quiet = int(HOSTS_MEMORY_S // GAP_S) + 1  # rounds of host a alone until the last sign is that old
    snaps = scrapes("aabba" + "a" * quiet)
    held = snaps[4:-1]  # from a's return on: its own intervals are valid, but the address serves two hosts
    assert all(kinds(s) == ["two_hosts"] and "disk_read_bytes_per_s" not in s.message["metrics"] for s in held)
    assert snaps[1].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)
    assert snaps[3].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)  # b's own interval
    assert reasons(snaps[2]) == reasons(snaps[4]) == ["host_changed"]
    last = snaps[-1]
    assert last.troubles == () and last.message["stale"] == []
    assert last.message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)


def test_a_node_that_rebooted_skips_one_interval_and_is_not_two_hosts():
    def rebooted(k: int, host: str) -> str:
        if k == 0:
            return page(0)
        text = with_value(page(k), "node_boot_time_seconds", T_B + GAP_S - 60.0)  # up 60 s at the second scrape
        return with_value(text, VDA, 5000.0 + (k - 1) * GAP_S * READ_RATE)

    snaps = scrapes("aaa", rebooted)
    assert reasons(snaps[1]) == ["host_changed"] and "disk_read_bytes_per_s" not in snaps[1].message["metrics"]
    assert all(s.troubles == () for s in snaps)
    assert snaps[2].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)


def test_a_clock_set_on_the_node_moves_its_boot_time_too_and_is_a_clock_jump_not_another_host():
    def clock_set(k: int, host: str) -> str:
        text = page(k)
        if k == 0:
            return text
        text = with_value(text, "node_time_seconds", T_B + k * GAP_S + 1e7)
        return with_value(text, "node_boot_time_seconds", BOOT + 1e7)  # the kernel's btime follows the clock

    snaps = scrapes("aaa", clock_set)
    assert reasons(snaps[1]) == ["clock_jump"] and all(s.troubles == () for s in snaps)
    assert snaps[2].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)


def test_a_page_held_up_on_the_bridge_side_is_not_another_host():
    a = assembler(NODE_URL)
    bridge_t = [0.0, GAP_S - 7.0, 2 * GAP_S]  # the second scrape began 7 s before the page was written
    snaps = [a.assemble([ok(NODE_URL, page(k), t)], 1000.0 + t) for k, t in enumerate(bridge_t)]
    assert reasons(snaps[1]) == ["clock_jump"] and all(s.troubles == () for s in snaps)
    assert snaps[2].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)


def test_counters_back_and_forth_on_pages_without_identity_are_caught_and_withheld():
    snaps = scrapes("ababab", lambda k, h: without_identity(page(k) if h == "a" else every_counter_ahead(page(k))))
    assert "disk_read_bytes_per_s" not in snaps[3].message["metrics"]
    assert all(s.troubles == () for s in snaps[:5])  # one bounce may be chance
    assert kinds(snaps[5]) == ["two_hosts"] and snaps[5].message["stale"] == NODE_GROUPS
    assert [reasons(s) for s in snaps[1:]] == [[], ["counter_reset"], ["counter_bounce"], ["counter_reset"],
                                               ["counter_bounce"]]
    assert snaps[5].troubles[0].detail == f"target {NODE_URL} answered as two hosts (its counters went back and forth)"


def test_one_small_counter_that_reset_and_regrew_is_no_bounce():
    """One disk's counter set back and then past its old value (a device re-attached): a tiny share of the page's
    series, not another host's page; its interval is a reset, the next gives rates."""
    values = [1000.0, 10.0, 2000.0, 3000.0]
    snaps = scrapes("aaaa", lambda k, h: without_identity(with_value(page(k), VDA, values[k])))
    assert [reasons(s) for s in snaps[1:]] == [["counter_reset"], [], []]
    assert all(s.troubles == () for s in snaps)
    assert snaps[3].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(1000.0 / GAP_S)


def test_a_single_forward_jump_on_a_bounded_rate_is_rejected_not_published():
    # eth0's counters restored from a node that had moved 100 TB: 1.2e13 B/s over 8.4 s
    eth0 = 'node_network_receive_bytes_total{device="eth0"}'
    jumped = with_value(NODE_B.read_text(), eth0, raw_sum(NODE_B, "node_network_receive_bytes_total",
                                                          device="eth0") + 1e14)
    a = assembler(NODE_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0)], 0.0)
    snap = a.assemble([ok(NODE_URL, jumped, GAP_S)], GAP_S)
    assert "network_rx_bytes_per_s" not in snap.message["metrics"]
    assert snap.rejected == {"network_rx_bytes_per_s": 1} and snap.clamped == {}
    assert snap.skips == () and snap.troubles == ()  # one host, one clock: only the range tells
    assert "disk_read_bytes_per_s" in snap.message["metrics"]  # the rest of the group stands


def test_a_normal_run_is_unchanged():
    a = assembler(NODE_URL, DCGM_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, DCGM_A, 0.0)], 1000.0)
    snap = a.assemble([ok(NODE_URL, NODE_B, GAP_S), ok(DCGM_URL, DCGM_B, GAP_S)], 1000.0 + GAP_S)
    m = snap.message["metrics"]
    dt = T_B - raw_sum(NODE_A, "node_time_seconds")
    read = raw_sum(NODE_B, "node_disk_read_bytes_total", device="vda") - raw_sum(
        NODE_A, "node_disk_read_bytes_total", device="vda")
    assert m["disk_read_bytes_per_s"] == pytest.approx(read / dt, rel=1e-9)
    assert m["cpu_usage_system"] == pytest.approx(0.08 / 16.81, rel=1e-6)
    assert snap.skips == () and snap.troubles == () and snap.message["stale"] == []
    assert snap.rejected == {} and snap.clamped == {}


def dcgm_other_host(text: str) -> str:
    return (text.replace('Hostname="worker-3"', 'Hostname="worker-4"')
            .replace("GPU-5b1d8c0e-3f7a-6c2e-91d4-0a8e4f6b2c71", "GPU-0e6a2d95-71b4-4c08-9f3e-5d2a8c61b7f0")
            .replace("GPU-c2e49a17-8d05-4b6f-a3e1-7f90d2b6e854", "GPU-94f1c7e2-3a6d-4b50-8e29-c1d07a5b3f86"))


def test_a_dcgm_address_answering_for_two_gpu_nodes_withholds_the_gpu_group_only():
    dcgm = {"a": DCGM_A.read_text(), "b": dcgm_other_host(DCGM_A.read_text())}
    a = assembler(NODE_URL, DCGM_URL)
    snaps = [a.assemble([ok(NODE_URL, page(k), k * GAP_S), ok(DCGM_URL, dcgm[h], k * GAP_S)], 1000.0 + k * GAP_S)
             for k, h in enumerate("aba")]
    assert kinds(snaps[2]) == ["two_hosts"] and snaps[2].message["stale"] == ["gpu"]
    assert "nvidia_smi_utilization_gpu" not in snaps[2].message["metrics"]
    assert reasons(snaps[1]) == ["host_changed"] and snaps[1].troubles == ()
    assert snaps[1].skips[0].url == DCGM_URL and "Hostname=worker-4" in snaps[1].skips[0].detail
    assert snaps[2].message["metrics"]["disk_read_bytes_per_s"] == pytest.approx(READ_RATE)  # node_exporter's stand


def restarted(text: str) -> str:
    """A dcgm-exporter page after a restart without ``NODE_NAME``: ``Hostname`` is the new pod's name."""
    return text.replace('Hostname="worker-3"', 'Hostname="dcgm-exporter-7xk2p"')


def nvidia_other_host(text: str) -> str:
    return text.replace("9e1f4a62-07c3-2d8b-5f61-c43a8b10d7e2", "3c7a0d58-e6b1-4f29-8a04-b95e2d1c6f73")


@pytest.mark.parametrize(("url", "make"), [
    (NODE_URL, page),
    (DCGM_URL, lambda k, h: DCGM_A.read_text() if h == "a" else dcgm_other_host(DCGM_A.read_text())),
    (NVIDIA_URL, lambda k, h: NVIDIA_A.read_text() if h == "a" else nvidia_other_host(NVIDIA_A.read_text())),
], ids=["node_exporter", "dcgm_exporter", "nvidia_gpu_exporter"])
def test_two_hosts_behind_one_address_are_caught_for_every_exporter(url, make):
    snaps = scrapes("aba", make, url)
    assert reasons(snaps[1]) == reasons(snaps[2]) == ["host_changed"]
    assert "two_hosts" in kinds(snaps[2]) and "two_hosts" not in kinds(snaps[1])


def test_a_dcgm_exporter_restarted_under_a_new_hostname_is_the_same_host():
    pages = [DCGM_A.read_text(), DCGM_B.read_text()]
    renamed = scrapes("aa", lambda k, h: restarted(pages[k]) if k else pages[k], DCGM_URL)
    same = scrapes("aa", lambda k, h: pages[k], DCGM_URL)
    assert renamed[1].skips == renamed[1].troubles == ()  # its GPUs' UUIDs are on both pages
    assert renamed[1].message == same[1].message  # the interval's rates as without the restart


def test_two_dcgm_hosts_are_caught_across_a_restart_of_one_exporter():
    # worker-3's exporter restarted (a new Hostname, the same GPUs) while worker-4 answers the address too
    text = DCGM_A.read_text()
    snaps = scrapes("aba", lambda k, h: dcgm_other_host(text) if h == "b" else [text, "", restarted(text)][k],
                    DCGM_URL)
    assert reasons(snaps[2]) == ["host_changed"] and kinds(snaps[2]) == ["two_hosts"]
    assert "Hostname=dcgm-exporter-7xk2p" in snaps[2].skips[0].detail


def on_master(text: str) -> str:
    """The page as dcgm-exporter's master writes it: its ``Hostname`` label is ``hostname`` (upstream PR #655)."""
    return text.replace('Hostname="', 'hostname="')


def gpus_replaced(text: str) -> str:
    """The same node (``Hostname`` kept) with other GPUs: no UUID in common with the page before."""
    return (text.replace("GPU-5b1d8c0e-3f7a-6c2e-91d4-0a8e4f6b2c71", "GPU-0e6a2d95-71b4-4c08-9f3e-5d2a8c61b7f0")
            .replace("GPU-c2e49a17-8d05-4b6f-a3e1-7f90d2b6e854", "GPU-94f1c7e2-3a6d-4b50-8e29-c1d07a5b3f86"))


@pytest.mark.parametrize("first", [on_master, lambda text: text], ids=["hostname", "Hostname_then_hostname"])
def test_dcgm_exporters_hostname_label_spelt_as_on_its_master_tells_the_host(first):
    line = next(x for x in on_master(DCGM_A.read_text()).splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    assert 'hostname="worker-3"' in line and "Hostname" not in line  # the fixture line as master writes it
    # the same hostname with new GPUs is the same node, whichever spelling the page before had (an upgrade)
    pages = [first(DCGM_A.read_text()), on_master(gpus_replaced(DCGM_B.read_text()))]
    snaps = scrapes("aa", lambda k, h: pages[k], DCGM_URL)
    assert snaps[1].skips == (), [s.detail for s in snaps[1].skips]
    # and another node's page under hostname is another host's, described by the label's name
    other = scrapes("ab", lambda k, h: on_master(DCGM_A.read_text() if h == "a" else dcgm_other_host(
        DCGM_A.read_text())), DCGM_URL)
    assert reasons(other[1]) == ["host_changed"] and "Hostname=worker-4" in other[1].skips[0].detail


def test_a_gpu_left_out_of_one_dcgm_scrape_is_still_the_same_host():
    one_gpu = "".join(line + "\n" for line in DCGM_B.read_text().splitlines()
                      if not (line.startswith("DCGM_FI_DEV_GPU_UTIL") and 'gpu="1"' in line))
    snaps = scrapes("aaa", lambda k, h: [DCGM_A.read_text(), one_gpu, DCGM_A.read_text()][k], DCGM_URL)
    assert all(s.skips == () and s.troubles == () for s in snaps)


async def test_the_bridge_counts_every_skipped_interval_and_logs_the_target_once(caplog):
    metrics = BridgeMetrics(CollectorRegistry())
    clock = ManualClock(1_796_208_576.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async with ExporterServer({"/node": [page(k, h) for k, h in enumerate("ababa")]}) as srv:
        url = srv.url("/node")
        target = Target("worker-3", (Endpoint(url, "node_exporter"),))
        with caplog.at_level(logging.INFO, logger="app.bridge.scraper"):
            await run_bridge(Settings(scrape_interval_s=GAP_S), [target], scrapes=5, clock=clock, sleep=sleep,
                             publish=False, metrics=metrics)
    assert metrics.value("rtt_bridge_intervals_skipped_total", node="worker-3", url=url, reason="host_changed") == 4
    assert metrics.value("rtt_bridge_intervals_skipped_total", node="worker-3", url=url, reason="counter_reset") == 0
    assert metrics.value("rtt_bridge_exporter_trouble_total", node="worker-3", exporter="node_exporter",
                         kind="two_hosts") == 3
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    changed = [line for line in lines if "host_changed" in line]
    assert changed == [f"worker-3: {url}: host_changed, answered as {HOST_B}, the previous page as {HOST_A}: that "
                       "interval's rates skipped"]  # four within a minute: one line
    assert [line for line in lines if "two_hosts" in line] == [
        f"worker-3: two_hosts from node_exporter: target {url} answered as two hosts ({HOST_B}; {HOST_A}); "
        "withholding cpu, memory, node"]
