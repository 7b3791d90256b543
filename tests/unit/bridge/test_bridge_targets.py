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


@pytest.mark.parametrize(("node_ip", "host"), [
    ("::1", "[::1]"),
    ("2001:db8:85a3:0:0:8a2e:370:7334", "[2001:db8:85a3:0:0:8a2e:370:7334]"),
    ("10.0.0.17", "10.0.0.17"),
    ("worker-7.example", "worker-7.example"),
])
def test_the_daemonset_targets_file_on_an_ipv6_node(tmp_path, node_ip, host):
    """status.hostIP on an IPv6 cluster is a bare IPv6 address: it goes into the URLs in brackets."""
    config = yaml.safe_load_all((REPO / "k8s" / "config.yaml").read_text())
    text = next(d for d in config if d["metadata"]["name"] == "rttsched-bridge-targets")["data"]["targets.yaml"]
    p = tmp_path / "targets.yaml"
    p.write_text(text)
    [t] = load_targets(p, {"NODE_NAME": "worker-7", "NODE_IP": node_ip})
    assert t.urls == tuple(f"http://{host}:{port}/metrics" for port in (9100, 9400, 9835))
    assert [e.port for e in t.endpoints] == [9100, 9400, 9835]


def test_an_ipv6_value_is_bracketed_only_where_it_is_a_urls_host(tmp_path):
    p = tmp_path / "targets.yaml"
    p.write_text("node: ${NODE}\ntargets:\n  - http://u@${IP}:9100/m\n  - http://[${IP}]:9400/m\n"
                 "  - http://h:9835/${IP}\n")
    [t] = load_targets(p, {"NODE": "w", "IP": "fd00::7"})
    assert t.urls == ("http://u@[fd00::7]:9100/m", "http://[fd00::7]:9400/m", "http://h:9835/fd00::7")



@pytest.mark.parametrize(("url", "env", "expected"), [
    ("http://${ADDR}/metrics", {"ADDR": "10.0.0.7:9100"}, "http://10.0.0.7:9100/metrics"),  # host and port
    ("http://${ADDR}/metrics", {"ADDR": "[fd00::7]:9100"}, "http://[fd00::7]:9100/metrics"),
    ("http://${CREDS}@${IP}:9100/m", {"CREDS": "user:pass", "IP": "fd00::7"}, "http://user:pass@[fd00::7]:9100/m"),
    ("http://${CREDS}@h:9100/m", {"CREDS": "fd00::7"}, "http://fd00::7@h:9100/m"),  # user info, not the host
    ("http://${IP}:9100/m", {"IP": "[fd00::7]"}, "http://[fd00::7]:9100/m"),  # already in brackets
    ("http://${IP}:9100/m", {"IP": "::ffff:10.0.0.7"}, "http://[::ffff:10.0.0.7]:9100/m"),  # IPv4-mapped
    ("http://${IP}:9100/m", {"IP": "fe80::1%eth0"}, "http://[fe80::1%eth0]:9100/m"),  # a zone id
    ("http://${IP}:9100/m", {"IP": "10.0.0.7"}, "http://10.0.0.7:9100/m"),
], ids=["host-port", "v6-host-port", "user-pass-at-v6", "v6-like-user", "bracketed", "v4-mapped", "zone", "v4"])
def test_a_value_is_bracketed_only_when_it_is_an_ipv6_address_as_a_urls_host(tmp_path, url, env, expected):
    """Only an IPv6 address (a zone id after %, IPv4-mapped) goes in brackets: ``host:port`` in one variable and
    ``user:pass`` before ``@`` are kept as they are (they were bracketed -- a URL rejected, or
    ``http://[user:pass]@...``)."""
    p = tmp_path / "targets.yaml"
    p.write_text(f"node: w\ntargets:\n  - {url}\n")
    [t] = load_targets(p, env)
    assert t.urls == (expected,)

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


KNOWN = "known: node_exporter, dcgm_exporter, nvidia_gpu_exporter"


@pytest.mark.parametrize("exporter", ["dcgm", "nvidia-gpu-exporter", "node-exporter", "DCGM_exporter"])
def test_an_exporter_that_is_not_known_is_refused_naming_the_key_and_the_known_ones(tmp_path, exporter):
    # a misspelt exporter used to be taken as is: its failures withheld nothing and its checks never ran
    p = tmp_path / "t.yaml"
    p.write_text(f"node: w1\ntargets:\n  - {{url: 'http://h:9400/metrics', exporter: {exporter}}}\n")
    with pytest.raises(TargetError) as err:
        load_targets(p, {})
    assert err.value.field == f"{p}.targets[0].exporter"
    assert err.value.message == f"unknown exporter {exporter!r} ({KNOWN})"
    p.write_text(f"nodes:\n  - {{node: w1, targets: [{{url: 'http://h:9400/metrics', exporter: {exporter}}}]}}\n")
    with pytest.raises(TargetError, match="unknown exporter") as err:
        load_targets(p, {})
    assert err.value.field == f"{p}: nodes[0].targets[0].exporter"


def test_the_known_exporters_are_the_mappings(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("node: w1\ntargets:\n  - {url: 'http://h:19100/metrics', exporter: my_exporter}\n")
    with pytest.raises(TargetError, match="unknown exporter 'my_exporter'"):
        load_targets(p, {})
    [t] = load_targets(p, {}, exporters=("node_exporter", "my_exporter"))
    assert t.endpoints[0].exporter == "my_exporter"


def test_a_flag_declares_the_exporter_of_the_url_before_it():
    t = parse_target_flag("node=w1,class=gpu,url=http://h:19100/metrics,exporter=node_exporter,"
                          "url=http://h:19400/metrics,exporter=dcgm_exporter,url=http://h:9835/metrics")
    assert t.endpoints == (Endpoint("http://h:19100/metrics", "node_exporter"),
                           Endpoint("http://h:19400/metrics", "dcgm_exporter"), Endpoint("http://h:9835/metrics"))


@pytest.mark.parametrize(("flag", "message"), [
    ("node=w,url=http://h:1/metrics,exporter=dcgm", f"unknown exporter 'dcgm' ({KNOWN})"),
    ("node=w,exporter=dcgm_exporter,url=http://h:1/metrics", "must follow the url= whose exporter it names"),
    ("node=w,url=http://h:1/metrics,exporter=dcgm_exporter,exporter=node_exporter",
     "given twice for http://h:1/metrics"),
])
def test_a_bad_exporter_in_a_flag_names_the_flag_and_the_key(flag, message):
    with pytest.raises(TargetError) as err:
        parse_target_flag(flag)
    assert (err.value.field, err.value.message) == (f"--target {flag!r}, exporter", message)


GOOD_NODES = ["worker-1", "w", "1node", "ip-10-0-0-11.eu-west-1.compute.internal", "a" * 253,
              "x" * 100 + ".y"]  # Kubernetes limits the name to 253 characters, not each label to 63


@pytest.mark.parametrize("node", GOOD_NODES)
def test_a_kubernetes_node_name_is_taken(tmp_path, node):
    assert parse_target_flag(f"node={node},url=http://h:9100/metrics").node == node
    p = tmp_path / "t.yaml"
    p.write_text(f"node: '{node}'\ntargets: [http://h:9100/metrics]\n")
    assert load_targets(p, {})[0].node == node


BAD_NODES = ["worker 1", "Worker-1", "-w", "w-", "w.", ".w", "a..b", "w_1", "wörker", "a" * 254, "w/1"]


@pytest.mark.parametrize("node", BAD_NODES)
def test_a_node_name_kubernetes_would_refuse_is_refused(tmp_path, node):
    # it would never match a node of the cluster: its metrics could never be used
    with pytest.raises(TargetError, match="must be a Kubernetes node name") as err:
        parse_target_flag(f"node={node},url=http://h:9100/metrics")
    assert err.value.field.endswith(", node")
    p = tmp_path / "t.yaml"
    p.write_text(f"node: '{node}'\ntargets: [http://h:9100/metrics]\n")
    with pytest.raises(TargetError, match="must be a Kubernetes node name") as err:
        load_targets(p, {})
    assert err.value.field == f"{p}.node"


def test_an_unexpanded_variable_in_a_flag_says_so():
    flag = "node=${NODE_NAME},url=http://10.0.0.1:9100/metrics"
    with pytest.raises(TargetError) as err:
        parse_target_flag(flag)
    assert str(err.value) == (f"--target {flag!r}, node: ${{NODE_NAME}} is not expanded in --target: give the "
                              "value, or use a targets file")
    with pytest.raises(TargetError) as err:
        parse_target_flag("node=$NODE_NAME,url=http://10.0.0.1:9100/metrics")
    assert err.value.message.startswith("$NODE_NAME is not expanded in --target")
    with pytest.raises(TargetError) as err:
        parse_target_flag("node=w1,url=http://${NODE_IP}:9100/metrics")
    assert err.value.message.startswith("${NODE_IP} is not expanded in --target")


def test_a_variable_a_file_cannot_expand_says_so(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("node: ${NODE-NAME}\ntargets: [http://h:9100/metrics]\n")
    with pytest.raises(TargetError) as err:
        load_targets(p, {})
    assert err.value.field == f"{p}.node"
    assert err.value.message.startswith("${NODE-NAME} is not expanded: a targets file expands ${NAME} only")


def test_every_shipped_targets_file_names_its_node_as_kubernetes_does(tmp_path):
    files = sorted((REPO / "deploy").rglob("targets*.yaml"))
    assert files
    for f in files:
        assert all(t.node for t in load_targets(f, {"NODE_NAME": "gpu-node-1", "NODE_IP": "10.0.0.7"}))
