"""``rttsched sim``'s bad input: one line naming the flag as typed (exit 2), before any run; and what it prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sim_cli import FAST, error_line

from app.cli import sim
from app.cli.main import build_parser, main
from app.config import Settings
from app.errors import ConfigError
from app.sim.hardware import preset
from app.sim.runner import SimConfig
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import SCENARIO_DIR, scenario_path


def setup(argv: list[str]) -> tuple[SimConfig, list[int], str]:
    return sim._setup(build_parser().parse_args(["sim", *argv]), Settings.from_env())


def test_zero_tasks_is_rejected_like_a_negative_count(capsys, tmp_path, no_run):
    line = error_line(["--tasks", "0", "--out", str(tmp_path)], capsys)
    assert line == "rttsched sim: error: --tasks: must be > 0 (got 0)"
    assert not no_run


def test_without_tasks_a_run_has_5000():
    config, _, _ = setup([])
    assert config.n_tasks == 5000


LARGE_ONLY = "--nodes: a node count applies to the large preset only (add --preset large)"


@pytest.mark.parametrize("argv, message", [
    (["--preset", "large", "--nodes", "0"], "--nodes: must be >= 4 (got 0)"),
    (["--preset", "large", "--nodes", "-3"], "--nodes: must be >= 4 (got -3)"),
    (["--nodes", "10"], LARGE_ONLY),
    (["--preset", "small", "--nodes", "10"], LARGE_ONLY),
])
def test_a_bad_node_count_is_named_as_typed(argv, message, capsys, tmp_path, no_run):
    assert error_line([*argv, *FAST, "--out", str(tmp_path)], capsys) == f"rttsched sim: error: {message}"
    assert not no_run


@pytest.mark.parametrize("argv, message", [
    (["--rate", "5", "--load", "0.5"], "--load: give --load or --rate, not both"),
    (["--trace", "t.csv"], "--trace: a trace file is read with --arrivals trace (add it)"),
    (["--arrivals", "bursty", "--trace", "t.csv"], "--trace: a trace file is read with --arrivals trace (add it)"),
])
def test_flags_that_contradict_each_other_are_refused(argv, message, capsys, tmp_path, no_run):
    """--load beside --rate was ignored (the rate won), and a trace without --arrivals trace ran Poisson arrivals."""
    assert error_line([*argv, *FAST, "--out", str(tmp_path)], capsys) == f"rttsched sim: error: {message}"
    assert not no_run


def test_nodes_sets_the_large_presets_size_and_zero_is_not_the_default():
    config, _, _ = setup(["--preset", "large", "--nodes", "8"])
    assert len(config.base_nodes()) == 8
    assert len(preset("large")) == 300
    with pytest.raises(ValueError, match=r"n_nodes: must be >= 4 \(got 0\)"):
        preset("large", 0)


@pytest.mark.parametrize("where, message", [
    ("file", "{out} exists and is not a directory"),
    ("file/sub", "cannot create {out}: Not a directory"),
])
def test_a_bad_out_fails_before_any_run(where, message, capsys, tmp_path, no_run):
    (tmp_path / "file").write_text("")
    out = str(tmp_path / where)
    line = error_line([*FAST, "--out", out], capsys)
    assert line == f"rttsched sim: error: --out: {message.format(out=out)}"
    assert not no_run


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_out_under_proc_fails_before_any_run(capsys, no_run):
    line = error_line([*FAST, "--out", "/proc/nope"], capsys)
    assert line.startswith("rttsched sim: error: --out: cannot create /proc/nope: ")
    assert not no_run


def test_out_is_created_before_the_runs(capsys, tmp_path, no_run):
    out = tmp_path / "a" / "b"
    assert main(["sim", *FAST, "--out", str(out)]) == 1  # the stand-in run's AssertionError, as main reports it
    assert "a run started" in capsys.readouterr().err
    assert out.is_dir() and len(no_run) == 1


def test_an_unknown_scenario_is_named_with_the_shipped_ones(capsys, tmp_path, no_run):
    line = error_line(["--scenario", "nope", "--out", str(tmp_path)], capsys)
    assert line.startswith("rttsched sim: error: --scenario: no such scenario 'nope' (shipped: default, bursty, ")
    assert "pulsing" in line
    assert not no_run


def test_a_shipped_scenario_is_found_by_name_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, seeds, _ = setup(["--scenario", "pulsing"])
    sc = load_scenario(SCENARIO_DIR / "pulsing.yaml")
    assert config == sc.config and seeds == sc.seeds
    assert scenario_path("pulsing") == SCENARIO_DIR / "pulsing.yaml"


def test_the_benches_use_the_same_scenario_lookup():
    import importlib

    for name in ("bench_policies", "bench_learning", "bench_oracle", "bench_regret", "bench_warmup"):
        assert importlib.import_module(name).scenario_path is scenario_path, name


def test_the_report_lines_name_each_file_once(capsys, tmp_path):
    assert main(["sim", *FAST, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    tail = out[out.index(next(line for line in out if line.startswith("report: "))):]
    assert tail == [f"report: {Path(tmp_path) / 'policies.json'}", "        beside it: policies.csv (the table)"]
    text = "\n".join(tail)
    assert text.count("policies.json") == 1 and text.count("policies.csv") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policies.csv", "policies.json"]


@pytest.mark.parametrize("argv, line", [
    (["--first-seed", "-3"], "--first-seed: must be >= 0 (got -3)"),
    (["--first-seed", "18446744073709551616"],
     "--first-seed: must be below 2**63 (got 18446744073709551616)"),
    (["--first-seed", "9223372036854775806", "--seeds", "3"],
     "--first-seed: the last seed, 9223372036854775806 + 3 - 1, must be below 2**63"),
    (["--policies", ","], "--policies: no policy named (got ','); 'all' or a comma-separated list of: kube_default, "
                          "round_robin, random, load_aware, target_load, load_aware_tuned, target_load_tuned, "
                          "static_best, rtt_aware, clairvoyant"),
    (["--policies", "kube_default,random,kube_default"],
     "--policies: 'kube_default' is named twice (each policy runs once per seed)"),
    (["--policies", ""], "--policies: no policy named (got ''); 'all' or a comma-separated list of: kube_default, "
                         "round_robin, random, load_aware, target_load, load_aware_tuned, target_load_tuned, "
                         "static_best, rtt_aware, clairvoyant"),
    (["--rate", "inf"], "--rate: must be finite (got inf)"),
    (["--load", "nan"], "--load: must be > 0 (got nan)"),
])
def test_bad_seeds_policies_and_rates_fail_before_any_run(argv, line, capsys, tmp_path, no_run):
    flags = [f for f in FAST if f not in ("--policies", "kube_default")] if "--policies" in argv else FAST
    assert error_line([*flags, *argv, "--out", str(tmp_path)], capsys) == f"rttsched sim: error: {line}"
    assert not no_run


def test_a_scenario_file_that_is_not_yaml_by_its_name_is_read_or_said(tmp_path, capsys, no_run):
    src = (SCENARIO_DIR / "default.yaml").read_text()
    as_json = tmp_path / "s.json"
    as_json.write_text(src)  # YAML: JSON is a subset, and the loader reads both
    assert scenario_path(str(as_json)) == as_json
    other = tmp_path / "s.txt"
    other.write_text(src)
    line = error_line(["--scenario", str(other), "--out", str(tmp_path)], capsys)
    assert line == f"rttsched sim: error: --scenario: {other}: a scenario file ends in .yaml, .yml or .json"
    assert not no_run


def demo_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["demo", "--no-live", "--no-html", *argv]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv, line", [
    (["--seed", "-1"], "--seed: must be >= 0 (got -1)"),
    (["--seed", "9223372036854775808"], "--seed: must be below 2**63 (got 9223372036854775808)"),
    (["--minutes", "1e300"], "--minutes: must be <= 1440, a day (got 1e+300)"),
    (["--minutes", "inf"], "--minutes: must be finite (got inf)"),
    (["--out", "{file}"], "--out: {file} exists and is not a directory"),
])
def test_bad_demo_flags_fail_before_any_run(argv, line, capsys, tmp_path, no_run):
    file = tmp_path / "file"
    file.write_text("")
    argv = [a.format(file=file) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert demo_error_line(argv, capsys) == f"rttsched demo: error: {line.format(file=file)}"
    assert not no_run


def test_the_demo_runs_every_baseline_so_its_goals_face_the_best():
    """The demo left out load_aware_tuned and target_load_tuned: its "best baseline" was the best of the rest."""
    from app.cli.demo import OFFLINE_POLICIES
    from app.sim.policies import BASELINES, POLICY_NAMES

    assert set(BASELINES) <= set(OFFLINE_POLICIES)
    assert list(OFFLINE_POLICIES) == list(POLICY_NAMES)  # the report's order: baselines, rtt_aware, clairvoyant


@pytest.mark.parametrize("rows, message", [
    ("1,gCTF,-5\n", "row 1: input_size_mb must be a number > 0 (got -5)"),
    ("1,gCTF,nan\n", "row 1: input_size_mb must be a number > 0 (got nan)"),
    ("1,ctffind,5\n", "row 1: unknown app 'ctffind' (known: Motioncor2, gCTF, upload)"),
    ("inf,gCTF,5\n", "row 1: ts must be a finite number of seconds (got inf)"),
])
def test_a_bad_trace_row_says_what_is_wrong_with_it(rows, message, tmp_path):
    import numpy as np

    from app.sim.workload import TraceError, trace_workload

    path = tmp_path / "t.csv"
    path.write_text("ts,app,input_size_mb\n" + rows)
    with pytest.raises(TraceError) as err:
        trace_workload(path, np.random.default_rng(1))
    assert str(err.value) == f"{path}: {message}"


def test_a_trace_that_is_not_utf8_is_named(tmp_path):
    import numpy as np

    from app.sim.workload import TraceError, trace_workload

    path = tmp_path / "t.csv"
    path.write_bytes(b"ts,app,input_size_mb\n1,\xff,5\n")
    with pytest.raises(TraceError, match=f"^{path}: 'utf-8' codec can't decode byte 0xff"):
        trace_workload(path, np.random.default_rng(1))


LEAVE_ALL = """name: leave
cluster: {nodes: [{class: gpu, gpu: RTX 4090}, {class: cpu}]}
workload: {kind: poisson, tasks: 100, load: 0.5}
events: [{kind: leave, node: gpu-1, at: 10%}]
seeds: 1
policies: kube_default
"""


def test_failed_tasks_are_shown_and_warned_about(tmp_path, capsys):
    """The only GPU node leaves at 10 %: the GPU tasks after it never run. The terminal showed a plain mean RTT
    (of the tasks that did run) and neither it nor the report said that any task failed."""
    import json

    path = tmp_path / "leave.yaml"
    path.write_text(LEAVE_ALL)
    assert main(["sim", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    runs = json.loads((tmp_path / "out" / "policies.json").read_text())["runs"]["kube_default"]
    failed, done = runs[0]["failed"], runs[0]["tasks"]
    assert failed > 0 and done + failed == 100
    head, row = out.splitlines()[0], next(line for line in out.splitlines() if line.startswith("kube_default "))
    assert head.split()[-1] == "failed" and row.split()[-1] == f"{failed:.1f}"
    warning = next(line for line in out.splitlines() if line.startswith("warning: "))
    assert "kube_default" in warning and "failed" in warning and "completed tasks" in warning
    html = (tmp_path / "out" / "report.html").read_text()
    for name in ("failed", "tasks done", "makespan s"):
        assert f">{name}</th>" in html, name
    assert f"<td>{failed:.1f}</td>" in html and f"<td>{done:.1f}</td>" in html
    assert "warning: tasks failed" in html.lower()


def test_without_failed_tasks_the_terminal_has_no_failed_column(tmp_path, capsys):
    assert main(["sim", *FAST, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "failed" not in out.splitlines()[0] and "warning" not in out


@pytest.mark.parametrize("text, problem", [
    (None, "No such file or directory"),
    ("ts,app,input_size_mb\n0.1,upload,abc\n", "row 1: needs ts, app, input_size_mb (could not convert string to "
                                               "float: 'abc')"),
])
def test_a_bad_trace_fails_at_setup_naming_the_flag(text, problem, capsys, tmp_path, no_run):
    """It was read by the first run, and its error named neither --trace nor the scenario's field."""
    trace = tmp_path / "t.csv"
    if text is not None:
        trace.write_text(text)
    flags = [f for f in FAST if f != "--tasks" and f != "50"]
    line = error_line([*flags, "--arrivals", "trace", "--trace", str(trace), "--out", str(tmp_path)], capsys)
    assert line == f"rttsched sim: error: --trace: {trace}: {problem}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: x\nworkload: {kind: trace, trace: t.csv}\nseeds: 1\n")
    line = error_line(["--scenario", str(scenario), "--out", str(tmp_path)], capsys)
    assert line == f"rttsched sim: error: {scenario}: workload.trace: {trace}: {problem}"
    assert not no_run


def test_first_seed_applies_to_a_scenario_as_to_the_flags():
    """With --scenario, --first-seed was dropped without a word: the scenario's own seeds ran."""
    sc = load_scenario(SCENARIO_DIR / "default.yaml")
    _, seeds, _ = setup(["--scenario", "default", "--first-seed", "6"])
    assert seeds == list(range(6, 6 + len(sc.seeds)))  # as many seeds as it lists, from 6: held-out seeds
    _, seeds, _ = setup(["--scenario", "default", "--first-seed", "6", "--seeds", "2"])
    assert seeds == [6, 7]
    _, seeds, _ = setup(["--scenario", "default"])
    assert seeds == sc.seeds
    _, seeds, _ = setup(["--first-seed", "3", "--seeds", "2"])
    assert seeds == [3, 4]


def test_first_seed_has_a_help_text():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["sim"]
    action = next(a for a in sub._actions if a.dest == "first_seed")
    assert action.help and "--scenario" in action.help


@pytest.mark.parametrize("name", ["report.html", "policies.csv"])
def test_a_directory_where_the_report_writes_a_file_fails_before_any_run(name, capsys, tmp_path, no_run):
    """It failed after every run, with IsADirectoryError's words."""
    (tmp_path / name).mkdir()
    flags = [f for f in FAST if f != "--no-html"]
    line = error_line([*flags, "--out", str(tmp_path)], capsys)
    assert line == f"rttsched sim: error: --out: {tmp_path / name} is a directory, where the report writes a file"
    assert main(["demo", "--no-live", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rttsched demo: error: --out: {tmp_path / name} is a directory, where the report writes a file"
    assert not no_run


def test_sim_says_it_writes_the_report_after_the_runs(capsys, tmp_path):
    """The bar reached 100 % and the plots then took seconds without a word."""
    flags = [f for f in FAST if f != "--no-html"]
    assert main(["sim", *flags, "--out", str(tmp_path)]) == 0
    assert "sim: writing the report" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--seeds", "9223372036854775808", "--tasks", "10"],
                                  ["--seeds", "9223372036854775807", "--tasks", "10"],
                                  ["--seeds", "10001", "--tasks", "10"],
                                  ["--scenario", "default", "--seeds", "9223372036854775807"],
                                  ["--first-seed", "3", "--seeds", "9223372036854775807"]])
def test_too_many_seeds_name_seeds(argv, capsys, no_run):
    """--seeds alone was blamed on --first-seed, and 2**63 - 1 seeds ended in MemoryError."""
    line = error_line([*argv, "--out", "/nonexistent"], capsys)
    n = argv[argv.index("--seeds") + 1]
    assert line == f"rttsched sim: error: --seeds: must be <= 10000 (got {n})"
    assert not no_run


def test_the_most_seeds_run_from_the_first():
    assert setup(["--seeds", "10000"])[1] == list(range(1, 10001))
    assert sim.MAX_SEEDS == 10_000 and "10000" in " ".join(
        a.help or "" for a in next(a for a in build_parser()._actions if a.dest == "command").choices["sim"]._actions)


def test_the_last_seed_past_2_63_names_first_seed(capsys, no_run):
    line = error_line(["--first-seed", str(2**63 - 2), "--seeds", "3", "--out", "/nonexistent"], capsys)
    assert line.startswith("rttsched sim: error: --first-seed: ") and len(line) <= 100
    assert not no_run


@pytest.mark.parametrize("seeds", ["9223372036854775807", "10001"])
def test_a_scenario_with_too_many_seeds_names_the_field(tmp_path, seeds):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: x\nworkload: {{kind: poisson, tasks: 10}}\nseeds: {seeds}\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert str(err.value) == f"{path}: seeds: must be <= 10000 (got {seeds})"
