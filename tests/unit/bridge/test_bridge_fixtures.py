"""The exporter fixtures hold only what their named exporter version emits on their named GPU (PROVENANCE.yaml),
and each GPU gets exactly the canonical metrics docs/bridge.md lists for it."""

from __future__ import annotations

import fnmatch

import pytest
import yaml
from bridge_fixtures import (
    A100_A,
    A100_B,
    DCGM_A,
    DCGM_B,
    EXPORTERS,
    M40_A,
    M40_B,
    NVIDIA_A,
    NVIDIA_B,
    NVIDIA_URL,
    PROVENANCE,
    gpu_node,
    raw_samples,
)

from app.bridge.mapping import load_mapping

FAMILIES = yaml.safe_load(PROVENANCE.read_text())["families"]
GPU_METRICS = {m.name for m in load_mapping().metrics if m.group == "gpu"}


def names(path):
    out = set()
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            out.add(line.split("{")[0].split()[0])
    return out


def test_every_fixture_file_has_its_provenance():
    listed = [f for fam in FAMILIES.values() for f in fam["files"]]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(p.name for p in EXPORTERS.glob("*.prom"))
    for fam in FAMILIES.values():
        assert fam["sources"] and isinstance(fam["captured"], bool) and fam["exporter"] and fam["gpu"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_fixture_holds_only_what_its_exporter_version_emits(family):
    fam = FAMILIES[family]
    for file in fam["files"]:
        found = names(EXPORTERS / file)
        assert found, file
        if fam["emits"] == "any":
            continue
        for name in found:
            assert any(fnmatch.fnmatchcase(name, pattern) for pattern in fam["emits"]), (file, name)
            assert not any(fnmatch.fnmatchcase(name, p) for p in fam.get("forbid", [])), (file, name)
            assert name not in fam.get("not_emitted", {}), (file, name)


def test_no_fixture_has_what_its_version_or_gpu_cannot_emit():
    for path in EXPORTERS.glob("*.prom"):
        found = names(path)
        # DCGM answers NOT_SUPPORTED for the NVML PCIe throughput fields on every GPU
        assert not {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"} & found, path.name
        if "rtx4090" in path.name or "m40" in path.name:
            assert not any(n.startswith("DCGM_FI_PROF_") for n in found), path.name  # datacenter Volta+ only
        if "nvidia_gpu_exporter-1.2.1" in path.name:
            assert not any(n.startswith("nvidia_smi_pcie_throughput") for n in found), path.name  # from v1.12.0
            assert "nvidia_smi_failed_scrapes_total" not in found or "failed" in path.name


def test_nvidia_gpu_exporter_labels_gpus_by_lower_case_uuid_without_prefix():
    for path in (NVIDIA_A, NVIDIA_B):
        for labels, _ in raw_samples(path, "nvidia_smi_utilization_gpu_ratio"):
            assert labels["uuid"] == labels["uuid"].lower() and not labels["uuid"].startswith("gpu-")


ALWAYS = {"nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "gpu_memory_total_bytes",
          "gpu_memory_used_fraction", "gpu_memory_copy_util", "gpu_temperature", "gpu_power_w", "gpu_sm_clock_mhz",
          "gpu_mem_clock_mhz", "gpu_count"}


@pytest.mark.parametrize(("gpu", "scrapes", "url", "extra"), [
    ("Tesla K20c, nvidia_gpu_exporter 1.2.1", (NVIDIA_A, NVIDIA_B), NVIDIA_URL, set()),
    ("Tesla M40, dcgm-exporter 3.3.5", (M40_A, M40_B), None, set()),
    ("RTX 4090, dcgm-exporter 3.3.5", (DCGM_A, DCGM_B), None, set()),
    ("A100, dcgm-exporter 3.3.5 with DCP", (A100_A, A100_B), None,
     {"gpu_engine_active", "gpu_dram_active", "pcie_rx_bytes", "pcie_tx_bytes"}),
])
def test_the_canonical_gpu_metrics_of_each_gpu(gpu, scrapes, url, extra):
    snap = gpu_node(*scrapes, **({"url": url} if url else {}))
    assert snap.message["stale"] == [] and snap.troubles == ()
    assert set(snap.message["metrics"]) & GPU_METRICS == ALWAYS | extra, gpu


def test_dcgm_memory_total_and_fraction_fall_back_to_used_plus_free_per_gpu():
    snap = gpu_node(DCGM_A, DCGM_B)
    used = {lab["gpu"]: v for lab, v in raw_samples(DCGM_B, "DCGM_FI_DEV_FB_USED")}
    free = {lab["gpu"]: v for lab, v in raw_samples(DCGM_B, "DCGM_FI_DEV_FB_FREE")}
    m = snap.message["metrics"]
    total = sum(used.values()) + sum(free.values())
    assert m["gpu_memory_total_bytes"] == total * 2**20
    assert m["gpu_memory_used_fraction"] == pytest.approx(sum(used.values()) / total)
    assert m["gpu_memory_total_bytes"] == 2 * 24217 * 2**20  # the driver's reserve is in neither


def test_a_gpu_missing_a_partner_series_is_left_out_of_the_fraction():
    text = DCGM_B.read_text()
    text = "\n".join(line for line in text.splitlines()
                     if not (line.startswith("DCGM_FI_DEV_FB_FREE") and 'gpu="1"' in line)) + "\n"
    from bridge_fixtures import DCGM_URL, assembler, ok

    snap = assembler(DCGM_URL).assemble([ok(DCGM_URL, text, 0.0)], 0.0)
    used0 = raw_samples(DCGM_B, "DCGM_FI_DEV_FB_USED")[0][1]
    free0 = raw_samples(DCGM_B, "DCGM_FI_DEV_FB_FREE")[0][1]
    assert snap.message["metrics"]["gpu_memory_used_fraction"] == pytest.approx(used0 / (used0 + free0))
