from __future__ import annotations

import pytest
import yaml

from app.bridge.errors import MappingError
from app.bridge.mapping import DEFAULT_PATH, load_mapping, stale_groups
from app.bridge.mapping_build import build


def doc():
    return yaml.safe_load(DEFAULT_PATH.read_text())


def test_the_shipped_mapping_has_the_seed_names_and_about_thirty_metrics():
    m = load_mapping()
    names = [x.name for x in m.metrics]
    assert {"nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "pcie_rx_bytes",
            "cpu_usage_system", "cpu_iowait", "memory_cache_usage"} <= set(names)
    assert 30 <= len(names) == len(set(names))
    assert {x.group for x in m.metrics} <= set(stale_groups())
    assert m.watchdog is not None and m.watchdog.groups == ("gpu",)


def test_units_convert_into_canonical_units():
    m = load_mapping()

    def scale(canonical, i):
        return m.metric(canonical).sources[i].scale

    assert scale("nvidia_smi_utilization_gpu", 0) == 0.01  # DCGM percent
    assert scale("nvidia_smi_utilization_gpu", 1) == 1.0  # nvidia_gpu_exporter ratio
    assert scale("nvidia_smi_memory_used", 0) == 1024**2  # MiB
    assert scale("pcie_rx_bytes", 1) == 1024  # DCGM KB counter
    assert scale("gpu_sm_clock_mhz", 1) == 1e-6  # Hz


def test_only_wanted_metrics_are_parsed():
    wanted = load_mapping().wanted
    assert {"node_cpu_seconds_total", "node_time_seconds", "node_scrape_collector_success",
            "nvidia_smi_command_exit_code", "node_memory_MemTotal_bytes"} <= wanted
    assert "go_goroutines" not in wanted


@pytest.mark.parametrize(("path", "value", "where"), [
    (("metrics", "cpu_iowait", "sources", 0, "kind"), "rate", "metrics.cpu_iowait.sources[0].kind"),
    (("metrics", "cpu_iowait", "group"), "disk", "metrics.cpu_iowait.group"),
    (("metrics", "load1", "aggregate"), "median", "metrics.load1.aggregate"),
    (("metrics", "load1", "range"), [2, 1], "metrics.load1.range"),
    (("metrics", "disk_read_bytes", "sources", 0, "exclude", "device"), "(", "exclude.device"),
    (("metrics", "nvidia_smi_memory_used", "sources", 0, "unit"), "MB", "sources[0].unit"),
    (("exporters", "dcgm_exporter", "port"), 99999, "exporters.dcgm_exporter.port"),
    (("watchdog", "activity"), "no_such_metric", "watchdog.activity"),
])
def test_a_bad_mapping_fails_naming_the_field(path, value, where):
    d = doc()
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(MappingError) as err:
        build(d, "mapping.yaml")
    assert where in err.value.field


def test_an_unreadable_mapping_file_names_it(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("metrics: [unclosed")
    with pytest.raises(MappingError, match="m.yaml"):
        load_mapping(p)
