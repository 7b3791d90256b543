"""The report's parts: goals with the scored row and why, cells with intervals only from two seeds, inline SVG
with unique ids and findable axis labels, the config table, rolling windows, the live pace column."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

from app.sim.report.goals import goal_rows
from app.sim.report.plots_rtt import rolling
from app.sim.report.sections import config_table, percentile_table, policy_table
from app.sim.report.svg import new_figure, to_svg
from app.sim.report.tables import cell, format_table, to_csv


def _fig(n: float) -> dict[str, float]:
    return {"mean": n, "ci95": 3.0, "n": 2.0}


def test_goals_are_scored_on_the_live_row_first_and_say_why_they_are_missed():
    agg = {"rtt_aware_live": {"mean_rtt_ms": _fig(95.0)}, "rtt_aware": {"mean_rtt_ms": _fig(70.0)},
           "kube_default": {"mean_rtt_ms": _fig(100.0)}, "clairvoyant": {"mean_rtt_ms": _fig(90.0)}}
    second = {"rtt_aware_live": {"mean_rtt_ms": 60.0}, "kube_default": {"mean_rtt_ms": 100.0}}
    rows = [r for r in goal_rows(agg, live=["rtt_aware_live"], second_half=second)
            if r["baseline"] == "kube_default" and r["figure"] == "mean_rtt_ms"]
    assert [r["row"] for r in rows] == ["rtt_aware_live", "rtt_aware"]
    live, offline = rows
    assert not live["met"] and offline["met"] is False  # -5 % and -30 % against a -37 % goal
    assert "the clairvoyant reference misses it too (-10.0 % against kube_default)" in live["why"]
    assert "second half of the tasks: -40.0 %, met there" in live["why"]
    vs_oracle = next(r for r in goal_rows(agg) if r["baseline"] == "clairvoyant")
    assert vs_oracle["met"] and vs_oracle["why"] == ""  # 70 vs 90: within +10 % of the clairvoyant


def test_cells_show_an_interval_only_from_two_seeds():
    assert cell({"mean": 123.45, "ci95": 0.0, "n": 1.0}, "mean_rtt_ms") == "123.5"
    assert cell({"mean": 123.45, "ci95": 4.26, "n": 3.0}, "mean_rtt_ms") == "123.5 ± 4.3"
    assert cell({"mean": 0.9512, "ci95": 0.0123, "n": 2.0}, "sla") == "0.951 ± 0.012"
    assert cell({"mean": float("nan"), "ci95": 0.0, "n": 2.0}, "sla") == "-"
    text = format_table({"a": {"mean_rtt_ms": {"mean": 1.0, "ci95": 0.0, "n": 1.0}}})
    assert "±" not in text and max(map(len, text.splitlines())) <= 100


def test_the_csv_leaves_the_interval_empty_with_one_seed():
    """One seed has no interval: policies.csv wrote 0.0 there, a zero-width interval that does not exist."""
    agg = {"random": {"mean_rtt_ms": {"mean": 180.0, "ci95": 0.0, "n": 1.0}},
           "clairvoyant": {"mean_rtt_ms": {"mean": 100.0, "ci95": 2.0, "n": 5.0}}}
    assert to_csv(agg).splitlines() == ["policy,figure,mean,ci95,n", "random,mean_rtt_ms,180.0,,1",
                                        "clairvoyant,mean_rtt_ms,100.0,2.0,5"]


def test_inline_svgs_keep_ids_unique_and_label_their_axes():
    svgs = []
    for k in range(2):
        fig, (ax,) = new_figure(3, 2)
        ax.plot([1, 2], [3, 4])
        ax.set_xlabel("time (s)")
        ax.set_ylabel("RTT (ms)")
        svgs.append(to_svg(fig, f"f{k}", "a <plot>"))
    page = "".join(svgs)
    ids = re.findall(r'id="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    refs = set(re.findall(r'(?:href="#|url\(#)([^")]+)', page))
    assert refs <= set(ids)  # every reference points into its own figure
    assert page.count('class="axis-label x-label"') == 2 and page.count('class="axis-label y-label"') == 2
    assert ">time (s)<" in page  # text stays text (svg.fonttype none)
    assert 'aria-label="a &lt;plot&gt;"' in svgs[0] and "<?xml" not in page and "<metadata>" not in page


def test_config_table_flattens_nested_values():
    html = config_table({"n_tasks": 300, "sla_ms": {"gCTF": 200.0}, "nodes": ["a", "b"], "mix": None,
                         "events": [{"kind": "slowdown", "node": "w1"}], "empty": []})
    assert "<th>sla_ms.gCTF</th><td class=\"text\">200.0</td>" in html
    assert "a, b" in html and "<th>events[0].kind</th>" in html
    assert html.count(">-</td>") == 2  # None and an empty list


def test_rolling_windows_average_the_tasks_that_arrived_in_them():
    n = 20
    run = SimpleNamespace(ok=np.ones(n, bool), submit_s=np.arange(n, dtype=float),
                          rtt_ms=np.where(np.arange(n) <= 10, 100.0, 300.0))
    ends, mean, p95 = rolling(run, window_s=5.0, step_s=5.0)
    assert ends.tolist() == [5.0, 10.0, 15.0, 20.0]
    # windows (end - 5, end]: tasks 1-5, 6-10, 11-15, then 16-19 (four tasks: too few for a figure)
    assert mean[:3].tolist() == [100.0, 100.0, 300.0] and np.isnan(mean[3])
    assert p95[:3].tolist() == [100.0, 100.0, 300.0]


def test_live_pace_and_simulator_speed_are_separate_columns():
    agg = {"rtt_aware_live": {"tasks_per_wall_s": {"mean": 24.0, "ci95": 0.0, "n": 1.0}},
           "kube_default": {"tasks_per_wall_s": {"mean": 19113.0, "ci95": 0.0, "n": 1.0}}}
    html = policy_table(agg, (), live={"rtt_aware_live"})
    live_row = re.search(r"<tr><th>rtt_aware_live</th>(.*?)</tr>", html).group(1)
    sim_row = re.search(r"<tr><th>kube_default</th>(.*?)</tr>", html).group(1)
    assert re.findall(r"<td>(.*?)</td>", live_row) == ["24.0", "-"]
    assert re.findall(r"<td>(.*?)</td>", sim_row) == ["-", "19113"]


def test_retrain_markers_are_not_coloured_like_the_apps():
    """Retrain kinds shared the apps' colours: a drift marker read as a gCTF point."""
    from app.sim.report.plots_learning import APP_COLOURS, REASON_COLOURS

    assert set(REASON_COLOURS.values()).isdisjoint(APP_COLOURS.values())
    assert len(set(REASON_COLOURS.values())) == len(REASON_COLOURS)


def test_the_percentile_table_prints_a_dash_where_there_is_no_value():
    """A run with no completed task printed nan there, where every other table prints "-"."""
    none_done = SimpleNamespace(apps=("a", "a"), rtt_ms=np.array([np.nan, np.nan]), ok=np.zeros(2, bool))
    html = percentile_table({"kube_default": [none_done]})
    assert "nan" not in html and html.count("<td>-</td>") == 3


def test_a_half_width_just_under_100_prints_digits_not_an_exponent():
    """``{:.2g}`` printed 99.7 as 1e+02."""
    assert cell({"mean": 2000.0, "ci95": 99.7, "n": 5.0}, "mean_rtt_ms") == "2000 ± 100"
    assert cell({"mean": 500.0, "ci95": 99.4, "n": 5.0}, "mean_rtt_ms") == "500.0 ± 99"


def test_a_goal_whose_row_completed_no_task_prints_a_dash():
    """It printed +nan% in the terminal and the report."""
    from app.sim.report.goals import format_goals
    from app.sim.report.sections import goals_table

    row = {"figure": "mean_rtt_ms", "row": "rtt_aware", "baseline": "kube_default", "change": float("nan"),
           "goal": -0.1, "met": False, "why": "no task completed"}
    line = format_goals([row]).splitlines()[1]
    assert "nan" not in line and line.split()[-3:] == ["-", "-10%", "no"]
    assert "nan" not in goals_table([row]) and "<td>-</td>" in goals_table([row])
