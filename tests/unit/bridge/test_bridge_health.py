"""Exporter trouble withholds metric groups: failed scrapes, self-reported failures, watchdog resets."""

from __future__ import annotations

import pytest
from bridge_fixtures import (
    DCGM_A,
    DCGM_B,
    DCGM_URL,
    DCGM_WATCHDOG,
    GAP_S,
    NODE_A,
    NODE_B,
    NODE_URL,
    NVIDIA_A,
    NVIDIA_FAILED,
    NVIDIA_URL,
    STREAMS,
    STREAMS_URL,
    assembler,
    failed,
    ok,
    two_rounds,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bridge.mapping import load_mapping
from app.contracts import encode

GPU_METRICS = {m.name for m in load_mapping().metrics if m.group == "gpu"}
CPU_METRICS = {m.name for m in load_mapping().metrics if m.group == "cpu"}


def kinds(snap):
    return sorted((t.exporter, t.kind) for t in snap.troubles)


def test_watchdog_reset_marks_gpu_stale_and_publishes_no_gpu_reading():
    a = assembler(NODE_URL, DCGM_URL, STREAMS_URL)
    snap = two_rounds(
        a, [ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, DCGM_B, 0.0), ok(STREAMS_URL, STREAMS, 0.0)],
        [ok(NODE_URL, NODE_B, GAP_S), ok(DCGM_URL, DCGM_WATCHDOG, GAP_S), ok(STREAMS_URL, STREAMS, GAP_S)])
    assert snap.message["stale"] == ["gpu"]
    assert kinds(snap) == [("dcgm_exporter", "watchdog_reset")]
    assert not GPU_METRICS & set(snap.message["metrics"])
    assert "cpu_usage_system" in snap.message["metrics"]  # the rest of the node is still published
    assert snap.message["node_class"] == "gpu"
    encode("node-metrics", snap.message)  # still a valid message


def test_zero_utilisation_without_active_streams_is_an_idle_gpu_not_trouble():
    idle_streams = STREAMS.read_text().replace("} 4", "} 0").replace("} 2", "} 0")
    a = assembler(DCGM_URL, STREAMS_URL)
    snap = a.assemble([ok(DCGM_URL, DCGM_WATCHDOG, 0.0), ok(STREAMS_URL, idle_streams, 0.0)], 0.0)
    assert snap.message["stale"] == [] and snap.troubles == ()
    assert snap.message["metrics"]["nvidia_smi_utilization_gpu"] == 0.0
    assert snap.message["metrics"]["cuda_stream_active"] == 0.0


def test_active_streams_with_busy_gpus_are_fine():
    snap = assembler(DCGM_URL, STREAMS_URL).assemble([ok(DCGM_URL, DCGM_B, 0.0), ok(STREAMS_URL, STREAMS, 0.0)], 0.0)
    assert snap.troubles == ()
    assert snap.message["metrics"]["cuda_stream_active"] == 6.0


def test_nvidia_exporter_reporting_its_own_failure_marks_gpu_stale():
    a = assembler(NODE_URL, NVIDIA_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0), ok(NVIDIA_URL, NVIDIA_A, 0.0)], 0.0)
    snap = a.assemble([ok(NODE_URL, NODE_B, GAP_S), ok(NVIDIA_URL, NVIDIA_FAILED, GAP_S)], GAP_S)
    assert snap.message["stale"] == ["gpu"]
    assert kinds(snap) == [("nvidia_gpu_exporter", "collector_failed"), ("nvidia_gpu_exporter", "no_data")]
    assert "exit_code" in snap.troubles[0].detail
    assert not GPU_METRICS & set(snap.message["metrics"])
    assert snap.message["node_class"] == "gpu"  # it has answered with GPU data before


def test_node_exporter_cpu_collector_failure_withholds_only_cpu():
    broken = NODE_B.read_text().replace('node_scrape_collector_success{collector="cpu"} 1',
                                        'node_scrape_collector_success{collector="cpu"} 0')
    a = assembler(NODE_URL)
    snap = two_rounds(a, [ok(NODE_URL, NODE_A, 0.0)], [ok(NODE_URL, broken, GAP_S)])
    assert snap.message["stale"] == ["cpu"]
    assert kinds(snap) == [("node_exporter", "collector_failed")]
    assert not CPU_METRICS & set(snap.message["metrics"])
    assert "memory_cache_usage" in snap.message["metrics"]


def test_meminfo_collector_failure_withholds_memory():
    broken = NODE_A.read_text().replace('node_scrape_collector_success{collector="meminfo"} 1',
                                        'node_scrape_collector_success{collector="meminfo"} 0')
    snap = assembler(NODE_URL).assemble([ok(NODE_URL, broken, 0.0)], 0.0)
    assert snap.message["stale"] == ["memory"]
    assert "memory_cache_usage" not in snap.message["metrics"] and "load1" in snap.message["metrics"]


def test_a_failed_scrape_withholds_that_exporters_groups():
    a = assembler(NODE_URL, DCGM_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, DCGM_A, 0.0)], 0.0)
    snap = a.assemble([ok(NODE_URL, NODE_B, GAP_S), failed(DCGM_URL, GAP_S, "timeout after 2s")], GAP_S)
    assert snap.message["stale"] == ["gpu"]
    assert kinds(snap) == [("dcgm_exporter", "scrape_failed")]
    assert snap.troubles[0].detail == "timeout after 2s"
    assert not GPU_METRICS & set(snap.message["metrics"])


def test_a_node_whose_every_scrape_fails_still_reports_itself_stale():
    a = assembler(NODE_URL, DCGM_URL, node_class="gpu")
    snap = a.assemble([failed(NODE_URL, 0.0), failed(DCGM_URL, 0.0)], 0.0)
    assert snap.message["metrics"] == {}
    assert snap.message["stale"] == ["cpu", "gpu", "memory", "node"]
    encode("node-metrics", snap.message)


def test_an_unparseable_body_is_a_failed_scrape():
    snap = assembler(NODE_URL).assemble([ok(NODE_URL, "node_load1 not-a-number\n", 0.0)], 0.0)
    assert kinds(snap) == [("node_exporter", "scrape_failed")]
    assert "invalid exposition" in snap.troubles[0].detail


def test_an_optional_endpoint_that_never_answered_is_not_trouble_until_it_has():
    a = assembler(NODE_URL, DCGM_URL, optional=(DCGM_URL,))
    snap = a.assemble([ok(NODE_URL, NODE_A, 0.0), failed(DCGM_URL, 0.0)], 0.0)
    assert snap.troubles == () and snap.message["node_class"] == "cpu"
    a.assemble([ok(NODE_URL, NODE_B, GAP_S), ok(DCGM_URL, DCGM_A, GAP_S)], GAP_S)
    snap = a.assemble([ok(NODE_URL, NODE_B, 2 * GAP_S), failed(DCGM_URL, 2 * GAP_S)], 2 * GAP_S)
    assert kinds(snap) == [("dcgm_exporter", "scrape_failed")]


def test_a_failed_endpoint_of_an_unknown_exporter_withholds_every_group_of_the_nodes_class():
    # an exporter on a port that is no default one, never answered and not declared: which groups it would
    # have given is unknown, so none of the node's can be trusted (the extender scores such a node neutral)
    url = "http://10.0.0.13:18080/metrics"
    snap = assembler(url).assemble([failed(url, 0.0)], 0.0)
    assert kinds(snap) == [("unknown", "scrape_failed")] and snap.troubles[0].groups == ("cpu", "memory", "node")
    assert snap.message["metrics"] == {} and snap.message["stale"] == ["cpu", "memory", "node"]
    snap = assembler(url, node_class="gpu").assemble([failed(url, 0.0)], 0.0)
    assert snap.message["stale"] == ["cpu", "gpu", "memory", "node"]
    # beside a node_exporter that answers: its readings are withheld too
    a = assembler(NODE_URL, url, node_class="gpu")
    snap = a.assemble([ok(NODE_URL, NODE_A, 0.0), failed(url, 0.0)], 0.0)
    assert snap.message["metrics"] == {} and snap.message["stale"] == ["cpu", "gpu", "memory", "node"]


LANDING = ("<html><head><title>Node Exporter</title></head><body><h1>Node Exporter</h1>"
           "<p><a href='/metrics'>Metrics</a></p></body></html>")
OTHER = "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 7\n"


@pytest.mark.parametrize("page", [LANDING, "", OTHER], ids=["landing-page", "empty", "no-exporter-metric"])
def test_a_200_without_any_metric_read_is_a_failed_scrape_of_that_exporter(page):
    a = assembler(NODE_URL, DCGM_URL)
    a.assemble([ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, DCGM_A, 0.0)], 0.0)
    snap = a.assemble([ok(NODE_URL, page, GAP_S), ok(DCGM_URL, DCGM_B, GAP_S)], GAP_S)
    assert kinds(snap) == [("node_exporter", "scrape_failed")]
    assert snap.troubles[0].detail.startswith("HTTP 200 without any metric")
    assert snap.message["stale"] == ["cpu", "memory", "node"] and snap.failed == {NODE_URL}
    assert not CPU_METRICS & set(snap.message["metrics"]) and "nvidia_smi_utilization_gpu" in snap.message["metrics"]
    snap = a.assemble([ok(NODE_URL, NODE_B, 2 * GAP_S), ok(DCGM_URL, page, 2 * GAP_S)], 2 * GAP_S)
    assert kinds(snap) == [("dcgm_exporter", "scrape_failed")] and snap.message["stale"] == ["gpu"]
    assert not GPU_METRICS & set(snap.message["metrics"]) and "memory_cache_usage" in snap.message["metrics"]


def test_a_200_without_any_metric_read_from_an_unknown_exporter_withholds_every_group():
    url = "http://10.0.0.13:18080/"
    snap = assembler(url, node_class="gpu").assemble([ok(url, LANDING, 0.0)], 0.0)
    assert kinds(snap) == [("unknown", "scrape_failed")]
    assert snap.message["metrics"] == {} and snap.message["stale"] == ["cpu", "gpu", "memory", "node"]


def test_an_optional_endpoint_that_only_gave_pages_without_metrics_has_never_answered():
    a = assembler(NODE_URL, DCGM_URL, optional=(DCGM_URL,))
    snap = a.assemble([ok(NODE_URL, NODE_A, 0.0), ok(DCGM_URL, LANDING, 0.0)], 0.0)
    assert snap.troubles == () and snap.message["stale"] == [] and snap.message["node_class"] == "cpu"


def test_a_message_without_any_metric_lists_every_group_of_its_class_as_stale():
    # an endpoint that answers, without trouble, with nothing a first scrape can turn into a value (counters
    # only): no metric, so no group may look fresh -- an empty, fresh message reads as an idle node
    counters_only = "".join(x + "\n" for x in NODE_A.read_text().splitlines()
                            if x.startswith("node_context_switches_total"))
    snap = assembler(NODE_URL).assemble([ok(NODE_URL, counters_only, 0.0)], 0.0)
    assert snap.troubles == () and snap.message["metrics"] == {}
    assert snap.message["stale"] == ["cpu", "memory", "node"]
    # a gpu node whose node_exporter fails and has no GPU endpoint: its gpu group is stale as well
    snap = assembler(NODE_URL, node_class="gpu").assemble([failed(NODE_URL, 0.0)], 0.0)
    assert snap.message["stale"] == ["cpu", "gpu", "memory", "node"]
    encode("node-metrics", snap.message)


def test_a_value_the_contract_cannot_carry_is_left_out():
    huge = NODE_A.read_text().replace("node_load1 0.27", "node_load1 1e+16")
    snap = assembler(NODE_URL).assemble([ok(NODE_URL, huge, 0.0)], 0.0)
    assert "load1" not in snap.message["metrics"] and "memory_cache_usage" in snap.message["metrics"]
    encode("node-metrics", snap.message)


_names = st.sampled_from(sorted(load_mapping().wanted))
_line = st.one_of(
    st.builds(lambda n, v: f"{n} {v}", _names, st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(lambda n, c, v: f'{n}{{cpu="{c}",mode="user",gpu="{c}"}} {v}', _names, st.integers(0, 3),
              st.floats(min_value=-1e20, max_value=1e20)),
    st.text(max_size=30),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_line, max_size=12), min_size=1, max_size=3))
def test_any_bodies_give_a_message_that_satisfies_the_contract(bodies):
    """Invariant: whatever the exporters answer, the assembler never raises and its message is valid."""
    a = assembler(NODE_URL, DCGM_URL)
    for i, lines in enumerate(bodies):
        text = "\n".join(lines)
        snap = a.assemble([ok(NODE_URL, text, float(i)), ok(DCGM_URL, text, float(i))], float(i))
        encode("node-metrics", snap.message)


@pytest.mark.parametrize(("page", "why"), [
    # cut inside a line of a metric the mapping does not read: the lines read parse, the rest of the page is lost
    (lambda text: text[:text.index("node_memory_MemTotal_bytes ") + 12], "cut short"),
    # a series given twice: its two samples would be added up (load1 twice as high)
    (lambda text: text.replace("node_load1 0.27\n", "node_load1 0.27\nnode_load1 0.27\n"), "node_load1 given twice"),
])
def test_a_page_that_is_not_whole_is_a_failed_scrape_not_a_fresh_reading(page, why):
    text = NODE_A.read_text()
    snap = assembler(NODE_URL).assemble([ok(NODE_URL, page(text), 0.0)], 0.0)
    (trouble,) = snap.troubles
    assert trouble.kind == "scrape_failed" and why in trouble.detail
    assert snap.message["stale"] == ["cpu", "memory", "node"] and "load1" not in snap.message["metrics"]
    whole = assembler(NODE_URL).assemble([ok(NODE_URL, text, 0.0)], 0.0)
    assert whole.troubles == () and whole.message["metrics"]["load1"] == pytest.approx(0.27)


def test_a_runaway_label_is_refused_before_it_is_parsed_into_memory():
    from app.bridge.errors import ExpositionError
    from app.bridge.exposition import MAX_SERIES, parse_exposition

    lines = [f'node_network_receive_bytes_total{{device="veth{i}"}} {i}\n' for i in range(MAX_SERIES + 1)]
    with pytest.raises(ExpositionError, match=f"more than {MAX_SERIES} series"):
        parse_exposition("".join(lines), keep={"node_network_receive_bytes_total"}, page=True)
    assert len(parse_exposition("".join(lines[:MAX_SERIES]), page=True)) == MAX_SERIES  # the limit itself passes
