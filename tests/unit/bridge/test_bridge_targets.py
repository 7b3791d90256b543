from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from app.bridge.errors import TargetError
from app.bridge.targets import Endpoint, load_targets, parse_target_flag

REPO = Path(__file__).resolve().parents[3]


def test_flag_with_class_model_and_two_urls():
    t = parse_target_flag("node=worker-1,class=gpu,gpu_model=Tesla M40,url=http://h:9100/metrics,"
                          "url=http://h:9400/metrics")
    assert (t.node, t.node_class, t.gpu_model) == ("worker-1", "gpu", "Tesla M40")
    assert t.endpoints == (Endpoint("http://h:9100/metrics"), Endpoint("http://h:9400/metrics"))
    assert t.endpoints[1].port == 9400


@pytest.mark.parametrize(("flag", "key", "message"), [
    ("node=w,class=tpu,url=http://h:1/", ", class", "must be one of"),
    ("node=w,url=ftp://h/metrics", "", "not an http"),
    ("node=w,url=http://h:99999/", "", "(?i)port"),
    ("node=w,colour=red,url=http://h/", "", "unknown key"),
    ("node=w,url", "", "key=value"),
    ("class=gpu,url=http://h/", ", node", "node name"),
    ("node=w,url=http://h/,url=http://h/", "", "twice"),
    ("node=w,url=http://[::1/m", "", "Invalid IPv6 URL"),
    ("node=w,url=http://h:abc/m", "", "(?i)port"),
])
def test_bad_flags_name_the_flag(flag, key, message):
    with pytest.raises(TargetError) as err:
        parse_target_flag(flag)
    assert err.value.field == f"--target {flag!r}{key}"  # the flag as typed, then the key at fault
    assert re.search(message, err.value.message)


def test_the_daemonset_targets_file_with_environment_variables(tmp_path):
    config = yaml.safe_load_all((REPO / "k8s" / "config.yaml").read_text())
    text = next(d for d in config if d["metadata"]["name"] == "rttsched-bridge-targets")["data"]["targets.yaml"]
    p = tmp_path / "targets.yaml"
    p.write_text(text)
    [t] = load_targets(p, {"NODE_NAME": "worker-7", "NODE_IP": "10.0.0.17"})
    assert t.node == "worker-7" and t.node_class is None
    assert t.urls[0] == "http://10.0.0.17:9100/metrics"
    assert [(e.exporter, e.optional) for e in t.endpoints] == [
        ("node_exporter", False), ("dcgm_exporter", True), ("nvidia_gpu_exporter", True)]


def test_a_file_with_several_nodes(tmp_path):
    p = tmp_path / "targets.yaml"
    p.write_text("nodes:\n"
                 "  - {node: a, class: cpu, targets: ['http://10.0.0.1:9100/metrics']}\n"
                 "  - node: b\n    class: gpu\n    targets:\n      - http://10.0.0.2:9100/metrics\n"
                 "      - {url: 'http://10.0.0.2:9400/metrics', exporter: dcgm_exporter}\n")
    a, b = load_targets(p)
    assert (a.node, a.node_class, b.node_class) == ("a", "cpu", "gpu")
    assert b.endpoints[1].exporter == "dcgm_exporter"


@pytest.mark.parametrize(("text", "message"), [
    ("node: ${NOT_SET_ANYWHERE}\ntargets: [http://h/]\n", "NOT_SET_ANYWHERE"),
    ("nodes: []\n", "non-empty"),
    ("nodes:\n  - {node: a, targets: [http://h/]}\n  - {node: a, targets: [http://i/]}\n", "twice"),
    ("node: a\ntargets: http://h/\n", "targets"),
    ("node: a\ntargets: []\n", "no targets"),
    ("node: [a\n", "cannot read"),
])
def test_bad_files_fail_with_a_clear_message(tmp_path, text, message):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(TargetError, match=message):
        load_targets(p, {})


@pytest.mark.parametrize(("text", "field", "message"), [
    ("node: a\nclas: gpu\ntargets: [http://h/]\n", "t.yaml.clas", "unknown key .known: node, class"),
    ("node: a\ntargets:\n  - {url: 'http://h/', optinal: true}\n", "t.yaml.targets[0].optinal", "unknown key"),
    ("node: a\ntargets:\n  - {url: 'http://h/', optional: 'false'}\n", "t.yaml.targets[0].optional",
     "must be true or false"),
    ("nodes: [{node: a, targets: ['http://h/']}]\nnode: b\n", "t.yaml.node", "unknown key .known: nodes"),
    ("node: a\ntargets: ['http://[::1/m']\n", "t.yaml.targets[0]", "Invalid IPv6 URL"),
    ("node: a\ntargets: [{url: 'http://h:x/m'}]\n", "t.yaml.targets[0].url", "(?i)port"),
])
def test_typos_and_bad_values_in_a_file_name_their_path(tmp_path, text, field, message):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(TargetError, match=message) as err:
        load_targets(p, {})
    assert err.value.field == str(tmp_path / field)


def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_bytes(b"\xff\xfe\n")
    with pytest.raises(TargetError, match="cannot read targets: 'utf-8' codec") as err:
        load_targets(p, {})
    assert err.value.field == str(p)
