"""Lost GPUs on the recorded pages: a GPU gone from its exporter's page, or one with a fatal Xid, is ``gpu_lost``.

The pages are the dcgm-exporter 3.3.5 captures of a node with two RTX 4090 (and one Tesla M40) and the
nvidia_gpu_exporter 1.2.1 ones of a Tesla K20c, edited here: a GPU's lines dropped, its Xid gauge set.
"""

from __future__ import annotations

import logging
import math

import pytest
from bridge_fixtures import (
    DCGM_A,
    DCGM_B,
    DCGM_URL,
    M40_A,
    NVIDIA_A,
    NVIDIA_FAILED,
    NVIDIA_URL,
    ExporterServer,
    assembler,
    failed,
    ok,
    raw_samples,
    with_value,
)
from prometheus_client import CollectorRegistry

from app.bridge.health import Trouble
from app.bridge.mapping import load_mapping
from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import Bridge, run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.clock import ManualClock
from app.config import Settings

KNOWN_S, FORGET_S = 30.0, 3600.0  # the shipped mapping's known_after_s and forget_after_s (docs/bridge.md)
XID = "DCGM_FI_DEV_XID_ERRORS"
STEP_S = 10.0  # between rounds
WARM = math.ceil(KNOWN_S / STEP_S) + 1  # rounds after which a GPU listed in each is known
GPU0, GPU1 = (labels for labels, _ in raw_samples(DCGM_A, "DCGM_FI_DEV_GPU_UTIL"))
PAGE = DCGM_A.read_text()
GPU0_UTIL = next(v for labels, v in raw_samples(DCGM_A, "DCGM_FI_DEV_GPU_UTIL") if labels["gpu"] == "0") / 100


def without(text: str, uuid: str) -> str:
    """``text`` without any line of the GPU ``uuid`` (as dcgm-exporter writes a GPU whose values went blank)."""
    return "".join(line + "\n" for line in text.splitlines() if f'"{uuid}"' not in line)


def with_xid(text: str, uuid: str, xid: int) -> str:
    series = next(line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith(XID) and uuid in line)
    return with_value(text, series, xid)


def rounds(pages: list[str | None], url: str = DCGM_URL) -> list[Snapshot]:
    """One snapshot per page, ``STEP_S`` apart (None: the scrape failed)."""
    a = assembler(url)
    return [a.assemble([ok(url, p, k * STEP_S) if p is not None else failed(url, k * STEP_S)], 1000.0 + k * STEP_S)
            for k, p in enumerate(pages)]


def kinds(snap: Snapshot) -> list[str]:
    return [t.kind for t in snap.troubles]


def test_the_mapping_reads_the_xid_gauge_for_this_check_only():
    m = load_mapping()
    assert XID in m.wanted and m.gpu_lost is not None and m.gpu_lost.exporters["dcgm_exporter"].xid == XID
    assert not any(XID in s.reads for metric in m.metrics for s in metric.sources)  # no model feature
    assert (m.gpu_lost.known_after_s, m.gpu_lost.forget_after_s) == (KNOWN_S, FORGET_S)
    assert raw_samples(DCGM_A, XID) and all(v == 0 for _, v in raw_samples(DCGM_A, XID))  # the pages carry it


def test_a_gpu_gone_from_the_page_is_lost_by_name_withholding_nothing_until_it_is_back():
    snaps = rounds([PAGE] * WARM + [without(PAGE, GPU1["UUID"])] * 2 + [PAGE])
    assert all(s.troubles == () for s in snaps[:WARM])
    lost = snaps[WARM]
    (t,) = lost.troubles
    assert (t.kind, t.exporter, t.groups, t.subject) == ("gpu_lost", "dcgm_exporter", (), GPU1["UUID"])
    when = "1970-01-01T00:17:20Z"  # the first page without it: 1000 + WARM * STEP_S
    assert t.detail == f"GPU 1, UUID {GPU1['UUID']}, NVIDIA GeForce RTX 4090: missing from the page since {when}"
    assert snaps[WARM + 1].troubles == (t,)  # the same trouble each round, since the same time
    # the other GPU's readings are published; the lost one has none left
    assert lost.message["stale"] == [] and lost.message["metrics"]["gpu_count"] == 1.0
    assert lost.message["metrics"]["nvidia_smi_utilization_gpu"] == GPU0_UTIL
    assert snaps[-1].troubles == () and snaps[-1].message["metrics"]["gpu_count"] == 2.0



def test_a_gpu_seen_too_briefly_is_not_missed():
    # one page is no GPU the node has: the bridge just started, or another page slipped in
    snaps = rounds([PAGE] + [without(PAGE, GPU1["UUID"])] * 3)
    assert all(s.troubles == () for s in snaps)
    # while one listed for known_after_s is
    assert kinds(rounds([PAGE] * WARM + [without(PAGE, GPU1["UUID"])])[-1]) == ["gpu_lost"]


def test_a_gpu_still_listed_with_xid_79_is_lost_at_once_and_clears_when_the_gauge_is_back_to_0():
    fell = with_xid(PAGE, GPU1["UUID"], 79)
    snaps = rounds([fell, fell, PAGE])
    (t,) = snaps[0].troubles  # at the first page: the Xid says it, no need to have known the GPU
    assert (t.kind, t.groups) == ("gpu_lost", ())
    assert t.detail == f"GPU 1, UUID {GPU1['UUID']}, NVIDIA GeForce RTX 4090: Xid 79: fallen off the bus"
    assert snaps[0].message["stale"] == [] and "nvidia_smi_utilization_gpu" in snaps[0].message["metrics"]
    assert snaps[1].troubles == (t,) and snaps[2].troubles == ()  # the exporter restarted after the reset: 0


def test_a_fatal_xid_on_a_gpu_without_readings_says_both():
    only_xid = "".join(line + "\n" for line in with_xid(PAGE, GPU1["UUID"], 79).splitlines()
                       if GPU1["UUID"] not in line or line.startswith(XID))
    (t,) = rounds([PAGE] * WARM + [only_xid])[-1].troubles
    assert t.detail.endswith(": Xid 79: fallen off the bus; no reading since 1970-01-01T00:17:20Z")


@pytest.mark.parametrize("xid", [48, 74, 95, 119, 120])
def test_other_xids_that_need_a_reset_are_lost_gpus(xid):
    (t,) = rounds([with_xid(PAGE, GPU0["UUID"], xid)])[0].troubles
    assert t.kind == "gpu_lost" and f"GPU 0, UUID {GPU0['UUID']}" in t.detail and f"Xid {xid}: " in t.detail


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 94])
def test_an_xid_the_gpu_recovers_from_is_no_lost_gpu(xid):
    # an application's fault (13, 31, 43, 45), a contained ECC error (94): the application stops, the GPU goes on
    snaps = rounds([with_xid(PAGE, GPU1["UUID"], xid)] * (WARM + 1) + [with_xid(PAGE, GPU1["UUID"], 79)])
    assert all(s.troubles == () for s in snaps[:-1])
    assert kinds(snaps[-1]) == ["gpu_lost"]  # the same gauge, with a fatal Xid
    from app.bridge.gpu_lost import FATAL_XIDS

    assert xid not in FATAL_XIDS


def test_a_scrape_that_failed_entirely_is_scrape_failed_only():
    snaps = rounds([PAGE] * WARM + [None, without(PAGE, GPU1["UUID"])])
    assert kinds(snaps[WARM]) == ["scrape_failed"]  # no page: nothing said of the GPUs
    assert kinds(snaps[WARM + 1]) == ["gpu_lost"]  # a page that answers without GPU 1


def test_a_lost_gpu_stays_reported_through_a_failed_scrape():
    gone = without(PAGE, GPU1["UUID"])
    snaps = rounds([PAGE] * WARM + [gone, None, gone])
    assert kinds(snaps[WARM + 1]) == ["scrape_failed", "gpu_lost"]
    assert snaps[WARM + 1].troubles[1] == snaps[WARM].troubles[0] == snaps[WARM + 2].troubles[0]


def test_an_exporter_that_restarted_and_lists_the_same_gpus_is_nothing():
    snaps = rounds([PAGE] * WARM + [None, None, DCGM_B.read_text(), PAGE, without(PAGE, GPU0["UUID"])])
    assert [kinds(s) for s in snaps[WARM:-1]] == [["scrape_failed"], ["scrape_failed"], [], []]
    (t,) = snaps[-1].troubles  # still the same GPUs, known across the restart
    assert t.subject == GPU0["UUID"]


K20C = raw_samples(NVIDIA_A, "nvidia_smi_gpu_info")[0][0]


def test_a_node_without_any_gpu_left_on_its_page_has_lost_them_all():
    k20c = K20C
    empty = without(NVIDIA_A.read_text(), k20c["uuid"])  # nvidia-smi ran fine (exit code 0) and listed none
    snaps = rounds([NVIDIA_A.read_text()] * WARM + [empty], url=NVIDIA_URL)
    lost = [t for t in snaps[-1].troubles if t.kind == "gpu_lost"]
    assert [t.detail.split(": ")[0] for t in lost] == [f"GPU, UUID {k20c['uuid']}, Tesla K20c"]  # 1.2.1: no index
    assert lost[0].exporter == "nvidia_gpu_exporter"


def test_an_exporter_that_says_its_collection_failed_tells_nothing_of_its_gpus():
    # nvidia-smi failed (exit code 9): nvidia_gpu_exporter lists no GPU, and says why
    empty = without(NVIDIA_A.read_text(), K20C["uuid"])  # exit code 0, no GPU
    snaps = rounds([NVIDIA_A.read_text()] * WARM + [NVIDIA_FAILED.read_text(), empty], url=NVIDIA_URL)
    assert "collector_failed" in kinds(snaps[WARM]) and "gpu_lost" not in kinds(snaps[WARM])
    assert "gpu_lost" in kinds(snaps[WARM + 1])  # a page that lists none while nvidia-smi ran fine


def restarted(text: str, hostname: str = "dcgm-exporter-7xk2p") -> str:
    """``text`` as dcgm-exporter writes it after a restart without ``NODE_NAME``: ``Hostname`` its new pod's name."""
    return text.replace('Hostname="worker-3"', f'Hostname="{hostname}"')


def test_an_exporter_restarted_under_a_new_hostname_keeps_the_lost_gpu_reported():
    # the runbook's step after a GPU reset: delete the exporter pod; its successor has another name
    gone = without(PAGE, GPU1["UUID"])
    snaps = rounds([PAGE] * WARM + [gone, None, restarted(gone), restarted(gone), restarted(PAGE)])
    (t,) = snaps[WARM].troubles
    assert t.kind == "gpu_lost" and t.subject == GPU1["UUID"]
    assert snaps[WARM + 1].troubles[1:] == (t,)  # through the restart's failed scrape
    assert snaps[WARM + 2].troubles == snaps[WARM + 3].troubles == (t,)  # the same GPU 0: the same node
    assert all(s.skips == () and s.forgotten == () for s in snaps)  # no host_changed
    assert snaps[-1].troubles == ()  # it clears when the GPU is back, not when the name changes


def test_a_gpu_replaced_on_a_one_gpu_node_is_forgotten_at_once_and_the_new_one_followed():
    # the same Hostname, a new UUID at the old one's index: the node was drained and the GPU replaced
    m40 = M40_A.read_text()
    (uuid,) = {labels["UUID"] for labels, _ in raw_samples(M40_A, XID)}
    new = "GPU-0d9e6c3b-52f1-4a87-b6e0-1c4f7a2d8e95"
    replaced = m40.replace(uuid, new)
    snaps = rounds([m40] * WARM + [None, replaced, replaced] + [with_xid(replaced, new, 79)])
    assert all(s.skips == () for s in snaps) and all(s.troubles == () for s in snaps[:WARM])
    assert kinds(snaps[WARM]) == ["scrape_failed"]  # the node down for the swap
    assert all(s.troubles == () for s in snaps[WARM + 1:-1])  # never reported lost
    (f,) = snaps[WARM + 1].forgotten
    assert f.subject == uuid and f.detail.endswith(f"replaced by UUID {new} at its index: no longer reported")
    assert snaps[WARM + 2].forgotten == ()
    assert [t.subject for t in snaps[-1].troubles] == [new]  # the new one is followed


def test_a_gpu_replaced_on_a_two_gpu_node_is_forgotten_and_the_other_left_alone():
    new = "GPU-7a4e1b90-2c6d-4f38-b5a1-d09c3e8f6b24"
    replaced = PAGE.replace(GPU1["UUID"], new)
    snaps = rounds([PAGE] * WARM + [without(PAGE, GPU1["UUID"]), replaced, with_xid(replaced, GPU0["UUID"], 79)])
    assert [t.subject for t in snaps[WARM].troubles] == [GPU1["UUID"]]  # lost while the node ran
    assert snaps[WARM + 1].troubles == () and [f.subject for f in snaps[WARM + 1].forgotten] == [GPU1["UUID"]]
    assert [t.subject for t in snaps[-1].troubles] == [GPU0["UUID"]]


def test_a_gpu_lost_whose_index_a_known_gpu_takes_stays_lost():
    # GPU 0 falls off the bus and the driver numbers GPU 1 as 0: its UUID is known, nothing was replaced
    renumbered = without(PAGE, GPU0["UUID"]).replace('gpu="1"', 'gpu="0"').replace('device="nvidia1"',
                                                                                  'device="nvidia0"')
    snaps = rounds([PAGE] * WARM + [renumbered] * 2)
    assert [t.subject for s in snaps[WARM:] for t in s.troubles] == [GPU0["UUID"]] * 2
    assert all(s.forgotten == () for s in snaps)


def test_a_gpu_lost_while_a_new_one_appears_at_another_index_stays_lost():
    added = without(PAGE, GPU1["UUID"]).replace(GPU0["UUID"], "GPU-e1f8a3c6-94b2-4d07-8c5e-2b6a0f7d3e19")
    snaps = rounds([without(PAGE, GPU0["UUID"])] * WARM + [added])  # GPU 1 gone; a new GPU at index 0
    assert [t.subject for t in snaps[-1].troubles] == [GPU1["UUID"]] and snaps[-1].forgotten == ()


def test_the_gpu_replaced_on_a_one_gpu_node_under_nvidia_gpu_exporter_is_another_host():
    # its page has the GPU's UUID alone to tell its host by: a new one shares nothing, the old GPU is forgotten
    k20c = NVIDIA_A.read_text()
    replaced = k20c.replace(K20C["uuid"], "3c7a0d58-e6b1-4f29-8a04-b95e2d1c6f73")
    snaps = rounds([k20c] * WARM + [replaced] * 2, url=NVIDIA_URL)
    assert [s.reason for s in snaps[WARM].skips] == ["host_changed"]
    assert all("gpu_lost" not in kinds(s) for s in snaps)


def test_a_gpu_on_the_page_of_another_host_keeps_the_gpus_remembered():
    # GPU 1 lost; then, under a new Hostname, a page listing GPU 1 without GPU 0: no value shared with the page
    # before, so the identity says another host -- yet GPU 1 is remembered, so this is the same machine
    gone = without(PAGE, GPU1["UUID"])
    snaps = rounds([PAGE] * WARM + [gone, restarted(without(PAGE, GPU0["UUID"]))])
    assert [s.reason for s in snaps[-1].skips] == ["host_changed"]
    (t,) = snaps[-1].troubles
    assert t.subject == GPU0["UUID"] and "missing from the page since" in t.detail


def test_a_page_of_another_host_listing_none_of_the_gpus_remembered_starts_afresh():
    gone = without(PAGE, GPU1["UUID"])
    other = restarted(PAGE.replace(GPU0["UUID"], "GPU-0e6a2d95-71b4-4c08-9f3e-5d2a8c61b7f0")
                      .replace(GPU1["UUID"], "GPU-94f1c7e2-3a6d-4b50-8e29-c1d07a5b3f86"), "worker-4")
    snaps = rounds([PAGE] * WARM + [gone, other, other])
    assert kinds(snaps[WARM]) == ["gpu_lost"]
    assert [s.reason for s in snaps[WARM + 1].skips] == ["host_changed"]
    assert snaps[WARM + 1].troubles == snaps[WARM + 2].troubles == ()  # worker-3's GPUs are not worker-4's


def test_a_gpu_missing_for_forget_after_s_is_forgotten_once():
    a = assembler(DCGM_URL)
    gone = without(PAGE, GPU1["UUID"])
    for k in range(WARM):
        a.assemble([ok(DCGM_URL, PAGE, k * STEP_S)], 1000.0 + k * STEP_S)
    t0 = WARM * STEP_S
    first = a.assemble([ok(DCGM_URL, gone, t0)], 1000.0 + t0)
    late = a.assemble([ok(DCGM_URL, gone, t0 + FORGET_S)], 1000.0 + t0 + FORGET_S)
    after = a.assemble([ok(DCGM_URL, gone, t0 + FORGET_S + 1)], 1000.0 + t0 + FORGET_S + 1)
    assert kinds(first) == ["gpu_lost"] and late.troubles == () and after.troubles == after.forgotten == ()
    (f,) = late.forgotten
    assert f.subject == GPU1["UUID"] and f"forgotten after {FORGET_S / 60:g} min" in f.detail
    # it comes back as a GPU seen afresh
    back = a.assemble([ok(DCGM_URL, PAGE, t0 + FORGET_S + 2)], 1000.0 + t0 + FORGET_S + 2)
    assert back.troubles == ()


async def test_the_bridge_counts_a_lost_gpu_every_scrape_and_logs_when_it_starts_and_clears(caplog):
    metrics = BridgeMetrics(CollectorRegistry())
    clock = ManualClock(1_796_208_576.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    gone = without(PAGE, GPU1["UUID"])
    async with ExporterServer({"/dcgm": [PAGE] * WARM + [gone] * 3 + [PAGE]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/dcgm"), "dcgm_exporter"),))
        with caplog.at_level(logging.INFO, logger="app.bridge.scraper"):
            await run_bridge(Settings(scrape_interval_s=STEP_S), [target], scrapes=WARM + 4, clock=clock,
                             sleep=sleep, publish=False, metrics=metrics)
    assert metrics.value("rtt_bridge_exporter_trouble_total", node="worker-3", exporter="dcgm_exporter",
                         kind="gpu_lost") == 3
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "gpu_lost" in r.getMessage()]
    when = "2026-12-02T10:50:16Z"  # the first page without GPU 1: the clock's start + WARM * STEP_S
    assert lines == [
        (logging.WARNING, f"worker-3: gpu_lost from dcgm_exporter: GPU 1, UUID {GPU1['UUID']}, NVIDIA GeForce "
                          f"RTX 4090: missing from the page since {when}"),
        (logging.INFO, f"worker-3: dcgm_exporter gpu_lost cleared ({GPU1['UUID']})"),
    ]


def test_a_forgotten_gpu_is_logged_as_such_not_as_cleared(caplog):
    bridge = Bridge(Settings(), [Target("worker-3", (Endpoint(DCGM_URL, "dcgm_exporter"),))],
                    metrics=BridgeMetrics(CollectorRegistry()))
    lost = Trouble("dcgm_exporter", "gpu_lost", (), "GPU 1, ...: missing from the page since ...", GPU1["UUID"])
    forgotten = Trouble("dcgm_exporter", "gpu_lost", (), "GPU 1, ...: ..., forgotten after 60 min", GPU1["UUID"])
    message = {"node": "worker-3", "metrics": {}, "stale": []}
    with caplog.at_level(logging.INFO, logger="app.bridge.scraper"):
        bridge._account("worker-3", Snapshot(message, (lost,), {}))
        bridge._account("worker-3", Snapshot(message, (), {}, forgotten=(forgotten,)))
    assert [r.getMessage() for r in caplog.records] == [
        "worker-3: gpu_lost from dcgm_exporter: GPU 1, ...: missing from the page since ...",
        "worker-3: gpu_lost from dcgm_exporter: GPU 1, ...: ..., forgotten after 60 min",
    ]


def test_two_gpus_lost_are_two_troubles_each_logged_on_its_own(caplog):
    bridge = Bridge(Settings(), [Target("worker-3", (Endpoint(DCGM_URL, "dcgm_exporter"),))],
                    metrics=BridgeMetrics(CollectorRegistry()))
    a = assembler(DCGM_URL)
    gone = without(PAGE, GPU1["UUID"])
    pages = [PAGE] * WARM + [gone, with_xid(gone, GPU0["UUID"], 79)]  # GPU 1 gone, then GPU 0 off the bus
    with caplog.at_level(logging.WARNING, logger="app.bridge.scraper"):
        for k, p in enumerate(pages):
            snap = a.assemble([ok(DCGM_URL, p, k * STEP_S)], 1000.0 + k * STEP_S)
            bridge._account("worker-3", snap)
    assert [t.subject for t in snap.troubles] == [GPU0["UUID"], GPU1["UUID"]]
    assert bridge.metrics.value("rtt_bridge_exporter_trouble_total", node="worker-3", exporter="dcgm_exporter",
                                kind="gpu_lost") == 3  # GPU 1 in two rounds, GPU 0 in one
    assert [r.getMessage().split(": ")[2].split(",")[0] for r in caplog.records] == ["GPU 1", "GPU 0"]
