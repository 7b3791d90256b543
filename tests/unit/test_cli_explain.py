"""``rttsched explain`` as a client: its table names every node in full, its flags are checked before anything is
sent, and an answer that is not the extender's is one line, exit 2. The server here is a stand-in that answers
what a test tells it to and keeps what it was sent; the real extender's answer is tested in
``tests/unit/extender/test_ext_explain.py``."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from app.cli.explain import WIDTH, format_answer
from app.cli.main import main

NO_SERVER = "http://127.0.0.1:9"  # nothing is sent to it: every check here fails first


def error_line(capsys: pytest.CaptureFixture[str], *, out: str = "") -> str:
    """The one line on stderr; no traceback and no exception class name in it; ``out`` on stdout."""
    got = capsys.readouterr()
    assert got.out == out
    err = got.err
    assert "Traceback" not in err, err
    assert not re.search(r"\b\w+(Error|Exception)\b", err), err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@dataclass
class StandIn:
    """What the stand-in answers (status, content type, body) and the bodies it was sent."""

    url: str = ""
    status: int = 200
    content_type: str = "application/json"
    body: bytes = b"{}"
    received: list[bytes] = field(default_factory=list)


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    state = StandIn()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            state.received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(state.status)
            self.send_header("Content-Type", state.content_type)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _node(name: str, hardware: str | None, score: int = 5, **extra: object) -> dict:
    return {"node": name, "hardware": hardware, "score": score, "source": "node-weights", "model_rtt_ms": 120.5,
            "correction": 1.0, "penalty": 1.0, "rtt_ms": 120.5, "credibility": 1.0, "learnt": False,
            "explored": False, **extra}


def _answer(nodes: list[dict]) -> dict:
    return {"pod": {"app": "gCTF", "namespace": "default", "name": "explain-gctf"}, "neutral": None,
            "best": nodes[0]["node"], "explored": None, "sla_relaxed": False, "contributions_method": "approx",
            "nodes": nodes}


def _rows(lines: list[str], names: list[str]) -> list[str]:
    return [line for line in lines if line.split() and line.split()[0] in names]


# -- the table names every node in full (it cut names to 15 characters and hardware to 13, no marker)

def test_nodes_that_differ_past_15_characters_are_told_apart():
    names = ["worker-gpu-pool-a-01", "worker-gpu-pool-a-02"]
    lines = format_answer(_answer([_node(names[0], "RTX A6000", 7), _node(names[1], "RTX 4090", 6)]))
    rows = _rows(lines, names)
    assert [r.split()[0] for r in rows] == names
    assert "RTX A6000" in rows[0] and "RTX 4090" in rows[1]
    assert max(map(len, lines)) <= WIDTH
    head = next(line for line in lines if line.startswith("node "))
    assert head.index("hardware") == rows[0].index("RTX")  # columns as wide as their longest cell
    assert head.index("score") + len("score") == rows[0].index(" 7") + 2


def test_cloud_node_names_are_in_full_and_every_line_fits():
    """EKS names (42 characters) and long GPU names do not fit one 100-column row: the name has its own line."""
    names = ["ip-10-0-12-34.eu-west-1.compute.internal", "ip-10-0-12-35.eu-west-1.compute.internal"]
    hardware = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    lines = format_answer(_answer([_node(names[0], hardware[0], 10), _node(names[1], hardware[1], 4)]))
    assert max(map(len, lines)) <= WIDTH
    assert [line for line in lines if line in names] == names
    for name, hw in zip(names, hardware, strict=True):
        below = lines[lines.index(name) + 1]
        assert below.split()[:len(hw.split())] == hw.split()


def test_hardware_too_long_for_any_row_is_cut_in_the_middle_with_a_marker():
    hardware = ["Vendor Accelerator Model With An Unusually Long Name rev A 80GB",
                "Vendor Accelerator Model With An Unusually Long Name rev A 40GB"]
    names = ["ip-10-0-12-34.eu-west-1.compute.internal", "ip-10-0-12-35.eu-west-1.compute.internal"]
    lines = format_answer(_answer([_node(names[0], hardware[0]), _node(names[1], hardware[1])]))
    assert max(map(len, lines)) <= WIDTH
    shown = [lines[lines.index(n) + 1] for n in names]
    assert all("…" in s for s in shown) and shown[0] != shown[1]
    assert shown[0].lstrip().startswith("Vendor") and "80GB" in shown[0] and "40GB" in shown[1]


def test_names_with_control_characters_are_escaped_not_printed_raw():
    lines = format_answer(_answer([_node("evil\x1b[2Jnode", "gpu\r\n")]))
    text = "\n".join(lines)
    assert "\x1b" not in text and "\r" not in text
    assert "evil\\x1b[2Jnode" in text and "gpu\\r\\n" in text


# -- --input-mb: a size in MB, and only where it is used (it was dropped silently)

TOO_BIG = "must be a size in MB >= 0 and at most 3.4028234663852886e+38, the largest the models take"


@pytest.mark.parametrize(("value", "said"), [
    ("-5", "must be a size in MB >= 0 (got -5)"), ("nan", "must be a size in MB >= 0 (got nan)"),
    ("-inf", "must be a size in MB >= 0 (got -inf)"), ("inf", f"{TOO_BIG} (got inf)"),
    ("1e300", f"{TOO_BIG} (got 1e+300)"), ("1e39", f"{TOO_BIG} (got 1e+39)"),
    ("3.4028235e38", f"{TOO_BIG} (got 3.4028235e+38)"),  # just past the limit: both said to the digit
])
def test_input_mb_that_is_no_size_is_named(value, said, capsys):
    """The extender takes such a size for none: it was sent, dropped there, and the answer said null."""
    assert main(["explain", "--url", NO_SERVER, "--app", "gCTF", "--nodes", "a", f"--input-mb={value}"]) == 2
    assert error_line(capsys) == f"rttsched explain: error: --input-mb: {said}"


@pytest.mark.parametrize("source", [["--pod", "{tmp}/pod.json", "--nodes", "a"], ["--args", "{tmp}/args.json"]])
def test_input_mb_is_refused_where_the_pod_comes_from_a_file(source, tmp_path, capsys):
    pod = {"metadata": {"name": "p", "labels": {"rttsched.io/app": "gCTF"}}}
    (tmp_path / "pod.json").write_bytes(orjson.dumps(pod))
    (tmp_path / "args.json").write_bytes(orjson.dumps({"Pod": pod, "NodeNames": ["a"]}))
    argv = ["explain", "--url", NO_SERVER, *[a.format(tmp=tmp_path) for a in source], "--input-mb", "512"]
    assert main(argv) == 2
    assert error_line(capsys).startswith("rttsched explain: error: --input-mb: only with --app ")


def test_nodes_are_refused_with_args_whose_body_names_the_candidates(tmp_path, capsys):
    (tmp_path / "args.json").write_bytes(orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": ["a"]}))
    assert main(["explain", "--url", NO_SERVER, "--args", str(tmp_path / "args.json"), "--nodes", "b"]) == 2
    assert error_line(capsys).startswith("rttsched explain: error: --nodes: only with --pod or --app ")


def test_input_mb_is_sent_exactly(stand_in, capsys):
    stand_in.body = orjson.dumps(_answer([_node("a", "cpu")]))
    argv = ["explain", "--url", stand_in.url, "--app", "gCTF", "--nodes", "a", "--input-mb", "1234567.5"]
    assert main(argv) == 0
    sent = orjson.loads(stand_in.received[0])
    assert float(sent["Pod"]["metadata"]["annotations"]["rttsched.io/input-size-mb"]) == 1234567.5


# -- an Explain object in the --args body is kept (it was replaced by the flags' defaults)

def _args_file(tmp_path: Path, **extra: object) -> str:
    path = tmp_path / "args.json"
    path.write_bytes(orjson.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"], **extra}))
    return str(path)


def test_the_body_s_explain_is_sent_as_it_is(stand_in, tmp_path, capsys):
    stand_in.body = orjson.dumps(_answer([_node("a", "cpu")]))
    own = {"top": 7, "contributions": "exact"}
    assert main(["explain", "--url", stand_in.url, "--args", _args_file(tmp_path, Explain=own)]) == 0
    assert orjson.loads(stand_in.received[0])["Explain"] == own


def test_a_body_without_explain_gets_the_flags(stand_in, tmp_path, capsys):
    stand_in.body = orjson.dumps(_answer([_node("a", "cpu")]))
    assert main(["explain", "--url", stand_in.url, "--args", _args_file(tmp_path), "--top", "5"]) == 0
    assert orjson.loads(stand_in.received[0])["Explain"] == {"top": 5, "contributions": "approx"}


@pytest.mark.parametrize("flags", [["--top", "5"], ["--exact"], ["--top", "3"]])
def test_the_body_s_explain_and_a_flag_is_a_conflict_named(flags, stand_in, tmp_path, capsys):
    path = _args_file(tmp_path, Explain={"top": 2})
    assert main(["explain", "--url", stand_in.url, "--args", path, *flags]) == 2
    line = error_line(capsys)
    assert line.startswith("rttsched explain: error: --args: ") and "Explain" in line and flags[0] in line
    assert stand_in.received == []


# -- an answer that is not the extender's is one line, exit 2 (it was a traceback's last line, exit 1)

@pytest.mark.parametrize(("content_type", "body", "why"), [
    ("text/html", b"<html><body>It works!</body></html>", "not JSON"),
    ("application/json", b"[1, 2]", "a JSON array, not an object"),
    ("application/json", b"{}", "no 'nodes'"),
    ("application/json", b'{"nodes": "x"}', "'nodes' is not an array"),
    ("application/json", b'{"pod": {}, "neutral": null, "best": null, "nodes": [1]}', "nodes[0] is not an object"),
    ("application/json", b'{"pod": {}, "neutral": null, "best": null, "nodes": [{"score": 5}]}',
      "nodes[0] has no 'node'"),
    ("application/json", b'{"pod": [], "neutral": null, "best": null, "nodes": []}', "'pod' is not an object"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_answer_that_is_not_an_explain_answer_is_one_line(content_type, body, why, as_json, stand_in, capsys):
    stand_in.content_type, stand_in.body = content_type, body
    argv = ["explain", "--url", stand_in.url, "--app", "gCTF", "--nodes", "a", *(["--json"] if as_json else [])]
    assert main(argv) == 2
    line = error_line(capsys)
    assert line == f"rttsched explain: error: the answer from {stand_in.url} is not an /explain answer ({why})"


@pytest.mark.parametrize("node", [
    {"node": "a", "score": 5, "contributions": [{"feature": "x"}], "margin": 1.0},
    {"node": "a", "score": 5, "contributions": [{"feature": "x", "value": "v", "contribution": 0.1}],
     "bias": 0.0, "margin": 1.0, "model_rtt_ms": 2.7, "model_key": "k", "model_version": 1},
    {"node": "a", "score": "high"},
])
def test_an_answer_whose_nodes_cannot_be_shown_is_one_line(node, stand_in, capsys):
    stand_in.body = orjson.dumps(_answer([node]))
    assert main(["explain", "--url", stand_in.url, "--app", "gCTF", "--nodes", "a"]) == 2
    assert error_line(capsys).startswith(f"rttsched explain: error: the answer from {stand_in.url} is not an "
                                         f"/explain answer (nodes[0]")


def test_a_contribution_without_its_feature_s_value_is_shown_with_a_dash(stand_in, capsys):
    """``value`` is optional in the answer (a feature the row lacks): it was a KeyError, exit 1."""
    node = _node("a", "RTX 4090", source="model", contributions=[{"feature": "load", "contribution": 0.5}],
                 bias=1.0, margin=2.0, model_key="gCTF:gpu", model_version=1)
    stand_in.body = orjson.dumps(_answer([node]))
    assert main(["explain", "--url", stand_in.url, "--app", "gCTF", "--nodes", "a"]) == 0
    assert "load=- +0.500; bias +1.000; margin 2.000 = 120.5 ms (gCTF:gpu v1)" in capsys.readouterr().out
