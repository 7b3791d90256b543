"""``rttsched publish`` without a broker (--dry-run): line-numbered problems, never a traceback."""

from __future__ import annotations

import json

from bridgekit import SPANS

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
