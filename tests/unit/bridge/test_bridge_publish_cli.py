"""``rttsched publish`` without a broker (--dry-run): line-numbered problems, never a traceback."""

from __future__ import annotations

import json

from bridge_fixtures import SPANS

from app.cli.main import main

GOOD = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
        "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}


def test_invalid_lines_are_reported_with_their_line_number_and_skipped(tmp_path, capsys):
    bad_schema = {k: v for k, v in GOOD.items() if k != "rtt_ms"}
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join([json.dumps(GOOD), "{not json", "", json.dumps(bad_schema),
                            json.dumps(dict(GOOD, task_id="t-2")), "[1, 2]"]) + "\n")
    assert main(["publish", "task-completions", str(p), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"{p}:2: invalid_json:")
    assert lines[1].startswith(f"{p}:4: schema:") and "rtt_ms" in lines[1]
    assert lines[2].startswith(f"{p}:6: not_an_object:")
    assert "Traceback" not in err
    assert "checked 2 message(s), 3 invalid record(s)" in out


def test_a_line_that_is_not_utf8_is_one_invalid_line_and_the_rest_are_read(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"task_id": "t-\xff"}\n'
                  + json.dumps(dict(GOOD, task_id="t-3")).encode() + b"\n")
    assert main(["publish", "task-completions", str(p), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert f"{p}:2: invalid_json: not UTF-8: byte 0xff at column 16" in err and "Traceback" not in err
    assert "checked 2 message(s), 1 invalid record(s)" in out


def test_stdin_is_read_as_bytes_too(monkeypatch, capsys):
    import io
    import sys

    stdin = io.TextIOWrapper(io.BytesIO(b"\xfe\n" + json.dumps(GOOD).encode() + b"\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["publish", "task-completions", "-", "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert "<stdin>:1: invalid_json: not UTF-8" in err and "checked 1 message(s), 1 invalid" in out


def test_a_value_over_the_contracts_size_is_an_invalid_line(tmp_path, capsys):
    """A node-metrics scrape whose value would be over 1 MiB is an invalid line, like any other, and the lines after
    it are read on (before: the batch's encoding failed, and publish ended with exit status 2). Its 6,000 metrics are
    more than the contract's 512 a scrape may carry, which is what its line says (a valid scrape stays far below
    1 MiB)."""
    def scrape(node, metrics):
        return {"node": node, "ts": 1.0, "node_class": "cpu", "metrics": {f"m{i:05d}" + "x" * 180: 1.0
                                                                           for i in range(metrics)}}

    p = tmp_path / "scrapes.jsonl"
    p.write_text("\n".join(json.dumps(scrape(n, m)) for n, m in (("w1", 2), ("w2", 6_000), ("w3", 2))) + "\n")
    assert main(["publish", "node-metrics", str(p), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert (f"{p}:2: schema: data.metrics must contain less than or equal to 512 properties (it has 6,000)" in err
            and "Traceback" not in err), err
    assert "checked 2 message(s), 1 invalid record(s)" in out, out


def test_all_valid_lines_exit_zero(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(GOOD) + "\n")
    assert main(["publish", "task-completions", str(p), "--dry-run"]) == 0
    assert "checked 1 message(s), 0 invalid" in capsys.readouterr().out


def test_pretty_printed_jaeger_span_file_is_one_record(capsys):
    assert main(["publish", "task-completions", str(SPANS / "jaeger-span.json"), "--from", "jaeger",
                 "--dry-run"]) == 0
    assert "checked 1 message(s), 0 invalid" in capsys.readouterr().out


def test_otlp_export_spans_that_are_no_task_are_counted(capsys):
    assert main(["publish", "task-completions", str(SPANS / "otlp-export.json"), "--from", "otlp",
                 "--dry-run"]) == 0
    assert "checked 2 message(s), 1 span(s) that are no task skipped, 0 invalid" in capsys.readouterr().out


def test_a_malformed_span_is_an_invalid_record(tmp_path, capsys):
    span = json.loads((SPANS / "jaeger-span.json").read_text())
    span["duration"] = "soon"
    p = tmp_path / "spans.jsonl"
    p.write_text(json.dumps(span) + "\n")
    assert main(["publish", "task-completions", str(p), "--from", "jaeger", "--dry-run"]) == 1
    assert f"{p}:1: bad_span: not a Duration string" in capsys.readouterr().err


def test_bad_arguments_are_one_clear_line(tmp_path, capsys):
    assert main(["publish", "node-metrics", str(SPANS / "otlp-export.json"), "--from", "otlp", "--dry-run"]) == 2
    assert "--from" in capsys.readouterr().err
    assert main(["publish", "task-completions", str(tmp_path / "missing.jsonl"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "Traceback" not in err


def test_an_unreachable_broker_is_one_clear_line(tmp_path, monkeypatch, capsys):
    from app.kafka.embedded import free_port

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(GOOD) + "\n")
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    assert main(["publish", "task-completions", str(p)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Kafka" in err and "Traceback" not in err


def _targets(tmp_path, *nodes):
    p = tmp_path / "targets.yaml"
    p.write_text("nodes:\n" + "".join(f"  - {{node: {n}, targets: ['http://10.0.0.1:9100/metrics']}}\n" for n in nodes))
    return str(p)


def test_a_pod_name_as_node_is_warned_about_and_counted(capsys):
    assert main(["publish", "task-completions", str(SPANS / "otlp-export-base64.json"), "--from", "otlp",
                 "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "warning: node taken from host.name" in err and "--node-map" in err
    assert "1 node(s) from host.name" in out and "nodes not checked" in out


def test_a_completion_on_a_node_without_metrics_is_invalid(tmp_path, capsys):
    targets = _targets(tmp_path, "worker-1", "worker-2")
    assert main(["publish", "task-completions", str(SPANS / "otlp-export-base64.json"), "--from", "otlp",
                 "--targets", targets, "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert "unknown_node" in err and "gctf-runner-5d4c7b9f8-q8w3e" in err
    assert "checked 0 message(s)" in out and "not checked" not in out


def test_the_node_map_attributes_spans_to_their_node(tmp_path, capsys):
    node_map = tmp_path / "nodes.yaml"
    node_map.write_text("gctf-runner-5d4c7b9f8-q8w3e: worker-1\n")
    assert main(["publish", "task-completions", str(SPANS / "otlp-export-base64.json"), "--from", "otlp",
                 "--node-map", str(node_map), "--targets", _targets(tmp_path, "worker-1"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "checked 1 message(s)" in out and "warning" not in err


def test_completion_values_are_checked_against_the_known_nodes_too(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(dict(GOOD, task_id="t-2", node="worker-9")) + "\n")
    assert main(["publish", "task-completions", str(p), "--targets", _targets(tmp_path, "worker-1"),
                 "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert f"{p}:2: unknown_node:" in err and "checked 1 message(s), 1 invalid" in out


def test_a_bad_node_map_is_one_clear_line(tmp_path, capsys):
    node_map = tmp_path / "nodes.yaml"
    node_map.write_text("- worker-1\n")
    assert main(["publish", "task-completions", str(SPANS / "otlp-export.json"), "--from", "otlp",
                 "--node-map", str(node_map), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "nodes.yaml" in err and "Traceback" not in err


def test_a_node_map_that_is_not_utf8_is_one_clear_line(tmp_path, capsys):
    node_map = tmp_path / "nodes.yaml"
    node_map.write_bytes(b"pod-1: \xff\n")
    assert main(["publish", "task-completions", str(SPANS / "otlp-export.json"), "--from", "otlp",
                 "--node-map", str(node_map), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{node_map}: cannot read node map: 'utf-8' codec" in err and "Traceback" not in err


def test_ctrl_c_ends_a_publish_whose_input_pipe_stays_open():
    """Interrupted while its input has nothing to say, publish ends at once (130), with no crash at the exit
    from the thread still blocked reading the pipe."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "publish", "task-completions", "-", "--dry-run"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if k != "REDIS_URL"})
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"not json\n" + json.dumps(GOOD).encode() + b"\n")  # and the pipe stays open
        proc.stdin.flush()
        seen, deadline = b"", time.monotonic() + 60
        while b"<stdin>:1: invalid_json" not in seen:  # publish runs, and then waits for more input
            assert time.monotonic() < deadline, seen
            if select.select([proc.stderr], [], [], 0.5)[0]:
                seen += os.read(proc.stderr.fileno(), 4096)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130  # at once alone; a loaded machine may take a while to start
        err = (seen + proc.stderr.read()).decode()
        assert "rttsched publish: interrupted" in err and "Fatal Python error" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_give_up_time_that_is_not_positive_is_one_clear_line(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(GOOD) + "\n")
    for given in ("0", "-1", "nan"):
        assert main(["publish", "task-completions", str(p), "--give-up-after", given]) == 2
        err = capsys.readouterr().err
        assert "--give-up-after: must be a number of seconds > 0" in err and "Traceback" not in err
