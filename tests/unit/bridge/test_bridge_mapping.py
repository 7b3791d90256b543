from __future__ import annotations

import pytest
import yaml

from app.bridge.errors import MappingError
from app.bridge.mapping import DEFAULT_PATH, load_mapping
from app.bridge.mapping_build import build
from app.bridge.mapping_types import stale_groups


def doc():
    return yaml.safe_load(DEFAULT_PATH.read_text())


def test_the_shipped_mapping_has_the_seed_names_and_rates_named_as_rates():
    m = load_mapping()
    names = [x.name for x in m.metrics]
    assert {"nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "pcie_rx_bytes",
            "cpu_usage_system", "cpu_iowait", "memory_cache_usage"} <= set(names)
    assert 50 <= len(names) == len(set(names))
    kept = {"pcie_rx_bytes", "pcie_tx_bytes"}  # the seed's names, bytes/s (documented)
    for metric in m.metrics:
        counters = [s for s in metric.sources if s.kind == "counter"]
        fraction = metric.range == (0.0, 1.0)
        if counters and not fraction and metric.name not in kept and metric.name != "disk_queue_depth":
            assert metric.name.endswith("_per_s"), metric.name
    assert {x.group for x in m.metrics} <= set(stale_groups())
    assert m.watchdog is not None and m.watchdog.groups == ("gpu",)


def test_units_convert_into_canonical_units():
    m = load_mapping()

    def scale(canonical, i):
        return m.metric(canonical).sources[i].scale

    assert scale("nvidia_smi_utilization_gpu", 0) == 0.01  # DCGM percent
    assert scale("nvidia_smi_utilization_gpu", 1) == 1.0  # nvidia_gpu_exporter ratio
    assert scale("nvidia_smi_memory_used", 0) == 1024**2  # MiB
    assert scale("gpu_memory_total_bytes", 1) == 1024**2  # DCGM used + free, MiB
    assert scale("gpu_sm_clock_mhz", 1) == 1e-6  # Hz
    assert scale("cpu_frequency_mhz", 0) == 1e-6


def test_only_wanted_metrics_are_parsed():
    wanted = load_mapping().wanted
    assert {"node_cpu_seconds_total", "node_time_seconds", "node_scrape_collector_success",
            "nvidia_smi_command_exit_code", "node_memory_MemTotal_bytes"} <= wanted
    assert {"node_uname_info", "node_boot_time_seconds"} <= wanted  # who answered (app/bridge/identity.py)
    assert "go_goroutines" not in wanted


@pytest.mark.parametrize(("path", "value", "where"), [
    (("metrics", "cpu_iowait", "sources", 0, "kind"), "rate", "metrics.cpu_iowait.sources[0].kind"),
    (("metrics", "cpu_iowait", "group"), "disk", "metrics.cpu_iowait.group"),
    (("metrics", "load1", "aggregate"), "median", "metrics.load1.aggregate"),
    (("metrics", "load1", "range"), [2, 1], "metrics.load1.range"),
    (("metrics", "disk_read_bytes_per_s", "sources", 0, "exclude", "device"), "(", "exclude.device"),
    (("metrics", "gpu_memory_total_bytes", "sources", 1, "plus"), None, "sources[1].plus"),
    (("metrics", "memory_cache_usage", "sources", 0, "denominator"), [], "sources[0].denominator"),
    (("metrics", "load1", "tolerance"), 0.1, "metrics.load1.tolerance"),
    (("metrics", "disk_io_busy", "tolerance"), -1, "metrics.disk_io_busy.tolerance"),
    (("metrics", "load1", "ranges"), [0, 1], "metrics.load1"),
    (("watchdog", "flat_for_s"), "soon", "watchdog.flat_for_s"),
    (("metrics", "nvidia_smi_memory_used", "sources", 0, "unit"), "MB", "sources[0].unit"),
    (("exporters", "dcgm_exporter", "port"), 99999, "exporters.dcgm_exporter.port"),
    (("watchdog", "activity"), "no_such_metric", "watchdog.activity"),
    (("exporters", "node_exporter", "identity", "label"), {"node_uname_info": "nodename"},
     "exporters.node_exporter.identity"),
    (("exporters", "dcgm_exporter", "identity"), {}, "exporters.dcgm_exporter.identity"),
    (("exporters", "nvidia_gpu_exporter", "identity", "labels", "nvidia_smi_gpu_info"), 5,
     "identity.labels.nvidia_smi_gpu_info"),
    (("gpu_lost", "forget_after_s"), 10, "gpu_lost.forget_after_s"),
    (("gpu_lost", "known_after_s"), -1, "gpu_lost.known_after_s"),
    (("gpu_lost", "exporters", "node_exporter"), {"uuid": "UUID"}, "gpu_lost.exporters.node_exporter"),
    (("gpu_lost", "exporters", "dcgm_exporter", "uuid"), None, "gpu_lost.exporters.dcgm_exporter.uuid"),
    (("gpu_lost", "exporters", "dcgm_exporter", "xids"), [79], "gpu_lost.exporters.dcgm_exporter"),
    (("gpu_lost", "exporters"), {}, "gpu_lost.exporters"),
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
    with pytest.raises(MappingError, match="m.yaml") as info:
        load_mapping(p)
    assert "\n" not in str(info.value) and "line 1, column " in str(info.value)  # one line, the spot named


def test_a_mapping_file_that_is_not_utf8_names_it(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_bytes(b"metrics: \xff\n")
    with pytest.raises(MappingError, match="cannot read mapping: 'utf-8' codec") as info:
        load_mapping(p)
    assert info.value.field == str(p)


def test_the_simulator_emits_canonical_names_only():
    from app.sim.metrics import ALL_METRICS

    canonical = {m.name for m in load_mapping().metrics}
    assert set(ALL_METRICS) <= canonical, set(ALL_METRICS) - canonical


@pytest.mark.parametrize("name", ["gpu_util[0]", "gpu util", "9lives", "x" * 195])
def test_a_canonical_name_the_node_metrics_contract_refuses_fails_at_load(name):
    """Every scrape carrying it would be dead-lettered by the worker (its feature names XGBoost would refuse):
    the mapping fails when it is loaded, naming the metric, not at the first scrape."""
    d = doc()
    d["metrics"][name] = d["metrics"]["load1"]
    with pytest.raises(MappingError) as err:
        build(d, "mapping.yaml")
    assert err.value.field == f"mapping.yaml: metrics.{name}"
    assert "not a metric name of the node-metrics contract" in str(err.value)
