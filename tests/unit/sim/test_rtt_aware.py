"""The simulator's rtt_aware runs the production learning path: the same functions as the worker, the trainer
and the extender, reproducibly, and every (app, node class) is learnt."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from sim_invariants import assert_invariants

from app.config import Settings
from app.scheduler import cycle
from app.sim.policies import rtt_aware, training
from app.sim.policies.rtt_aware import RttAware
from app.sim.results import WARMUP_FRACTION
from app.sim.runner import SimConfig, build_simulation, run_offline
from app.trainer.history import Dataset

SMALL = {"n_estimators": 20, "learning_rate": 0.3}
N_TASKS = 2500
SETTINGS = Settings()


def _factory(rng, **kw):
    return RttAware(rng, train_params=SMALL, settings=SETTINGS, **kw)


def _dataset(n: int) -> Dataset:
    return Dataset(np.zeros((n, 1)), np.ones(n), np.arange(n, dtype=np.float64), ("input_mb",))


class Calls:
    """Counts the calls the simulator makes through its references to production functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n: collections.Counter[str] = collections.Counter()
        for module, name in [(cycle, "decide"), (rtt_aware, "schedule"), (rtt_aware, "sample_value"),
                             (rtt_aware, "features_value"), (training, "retrain")]:
            monkeypatch.setattr(module, name, self._count(name, getattr(module, name)))
        for cls, method in [(rtt_aware.NodeTracker, "add"), (rtt_aware.NodeTracker, "close"),
                            (rtt_aware.SampleHistory, "add"), (rtt_aware.SampleGrowth, "due")]:
            monkeypatch.setattr(cls, method, self._count(f"{cls.__name__}.{method}", getattr(cls, method)))

    def _count(self, name, fn):
        def wrapper(*a, **kw):
            self.n[name] += 1
            return fn(*a, **kw)
        return wrapper


@pytest.fixture(scope="module")
def runs():
    cfg = SimConfig(n_tasks=N_TASKS)
    out = []
    for _ in range(2):
        sim = build_simulation(cfg, _factory, seed=7)
        sim.run()
        out.append((sim, sim.metrics()))
    return out


def test_the_simulator_and_the_live_processes_share_their_learning_functions():
    """The sim's references are the very objects the worker, the trainer and the extender call."""
    from app.extender import service as extender
    from app.streams import feedback_errors, feedback_join, feedback_state, feedback_weights, node_state
    from app.trainer import pipeline, registry
    from app.trainer import service as trainer

    assert training.retrain is trainer.retrain is pipeline.retrain
    assert training.score_champion is registry.score_champion is pipeline.score_champion
    assert rtt_aware.schedule is cycle.schedule and cycle.decide is extender.decide
    assert extender.filter_answer is cycle.filter_answer and extender.assume is cycle.assume
    assert rtt_aware.sample_value is feedback_join.node_sample_value
    assert rtt_aware.features_value is node_state.features_value
    assert rtt_aware.NodeTracker is feedback_state.NodeTracker
    assert rtt_aware.SampleGrowth is feedback_errors.SampleGrowth and rtt_aware.Debounce is feedback_errors.Debounce
    assert rtt_aware.sample_check_s is feedback_errors.sample_check_s
    assert rtt_aware.SampleHistory is trainer.SampleHistory
    assert feedback_weights.FeedbackLoop is feedback_state.FeedbackLoop  # node-weights: NodeTracker.weights_fields


def test_a_run_goes_through_them(monkeypatch):
    calls = Calls(monkeypatch)
    m = run_offline(SimConfig(n_tasks=1200), _factory, seed=3)
    n = calls.n
    # every task goes through one cycle at least (more while the filter leaves it no node), whose filter and
    # prioritize each decide (once when the filter keeps every node)
    assert n["schedule"] >= 1200 and n["schedule"] <= n["decide"] <= 2 * n["schedule"]
    assert n["NodeTracker.add"] > 500 and n["SampleHistory.add"] == 1200
    assert n["sample_value"] == 1200 and n["features_value"] > 100 and n["NodeTracker.close"] > 10
    assert n["retrain"] >= 3 and n["SampleGrowth.due"] > 10
    assert m.trace.retrains and m.trace.errors and m.trace.weights and m.trace.windows


def test_every_app_and_node_class_is_learnt(runs):
    sim, m = runs[0]
    pol = sim.policy
    keys = {"gCTF:gpu", "Motioncor2:gpu", "upload:gpu", "upload:cpu"}
    assert keys <= set(pol.models), pol.models
    for key, (_, champion) in pol.models.items():  # judged on the rows after its fit set (test_trainer_unseen)
        ts = pol.history.dataset(key).ts
        assert champion.fit_end_ts is not None and ts[0] < champion.fit_end_ts < ts[-1], key
    assert all(pol.samples_per_key[k] >= SETTINGS.cold_start_samples for k in keys), pol.samples_per_key
    joined = sim.cluster.nodes[-1]
    assert joined.join_at_s > 0
    assert all(pol.trackers[joined.name].samples(app) >= 3 for app in ("gCTF", "Motioncor2", "upload"))


def test_reproducible_bit_for_bit_with_background_training(runs):
    (sim, a), (_, b) = runs
    assert_invariants(a, sim.cluster.nodes)
    assert a.fingerprint() == b.fingerprint()
    assert a.trace.retrains == b.trace.retrains


def _median_accuracy(m, key: str) -> float:
    """1 - MAPE of a trivial predictor on the tasks ``m.accuracy()`` scores for ``key``: the median RTT of
    the app on the node class over those very tasks (a constant that knows the answer's centre)."""
    _, app, node_class = key.split(":")
    n = len(m.apps)
    sel = ((np.arange(n) >= int(WARMUP_FRACTION * n)) & m.ok & np.isfinite(m.predicted_ms) & (m.rtt_ms > 0)
           & (np.array(m.apps) == app) & (m.task_node_class() == node_class))
    rtt = m.rtt_ms[sel]
    return float(1.0 - np.mean(np.abs(np.median(rtt) - rtt) / rtt))


def test_models_predict_well_once_learnt(runs):
    """Every model beats the per app x class median by a wide margin: measured (seeds 7, 1, 2, 3) 0.67-0.94
    against 0.25-0.61, the smallest lead 0.25 (upload:gpu, seed 7); held to 0.15."""
    _, m = runs[0]
    acc = m.accuracy()
    assert set(acc) == {"acc:gCTF:gpu", "acc:Motioncor2:gpu", "acc:upload:gpu", "acc:upload:cpu"}, acc
    for key, a in acc.items():
        assert a > _median_accuracy(m, key) + 0.15, (key, a, _median_accuracy(m, key))
    pred = m.predicted_ms[np.isfinite(m.predicted_ms)]
    assert len(pred) > 0.7 * N_TASKS and np.all(pred > 0)


def test_fixed_window_pins_dwa():
    m = run_offline(SimConfig(n_tasks=800), lambda rng: _factory(rng, dwa=False), seed=2)
    assert m.policy == "rtt_aware_fixed_window"
    assert {w for _, _, w in m.trace.windows} == {SETTINGS.feature_window_s}


def test_beats_request_based_default(runs):
    """Measured 0.79-0.81 of kube_default's mean RTT (seeds 7, 1, 2, 3); held to 0.9. How it compares with
    the other baselines, with CIs, is bench/bench_policies.py's job."""
    _, m = runs[0]
    kube = run_offline(SimConfig(n_tasks=N_TASKS), "kube_default", 7)
    assert m.summary()["mean_rtt_ms"] < 0.9 * kube.summary()["mean_rtt_ms"]


def test_rejects_bad_options():
    with pytest.raises(ValueError, match="running_refresh_s"):
        RttAware(np.random.default_rng(0), running_refresh_s=-1.0)


def _degraded(policy: str, seed: int = 1, n_tasks: int = 2500):
    """The fastest GPU (worker-3) drops to 30 % of its speed at 40 % of the run; no metric shows it."""
    import simpy

    from app.sim.cluster import Cluster
    from app.sim.events import NodeEvent
    from app.sim.policies import make_policy
    from app.sim.runner import Simulation, _streams, build_nodes, build_workload

    cfg = SimConfig(n_tasks=n_tasks, events="none", join_node=False)
    rngs = _streams(seed)
    workload = build_workload(cfg, rngs["workload"])
    onset = 0.4 * workload.duration_s
    events = [NodeEvent("slowdown", "worker-3", onset, factor=1 / 0.3)]
    pol = _factory(rngs["policy"]) if policy == "rtt_aware" else make_policy(policy, rngs["policy"])
    env = simpy.Environment()
    cluster = Cluster(env, build_nodes(cfg, workload.duration_s), workload, pol, rngs["metrics"], events=events)
    sim = Simulation(cfg, seed, env, cluster, pol, events)
    sim.run()
    return sim.metrics(), onset


def test_an_unannounced_slowdown_changes_the_ranking_within_a_few_error_periods():
    """Seed 1; measured on seeds 1-3: GPU-task share on the slowed node 0.79-0.81 before, 0.27-0.35 from two
    error periods after the onset (clairvoyant 0.27-0.33); mean RTT after the onset 0.80-0.86 of the
    calibrated table's (which cannot see the slowdown) and 0.97-1.00 of kube_default's (which spreads by
    requests and happens to leave the slowed GPU its share)."""
    m, onset = _degraded("rtt_aware")
    kube, _ = _degraded("kube_default")
    table, _ = _degraded("static_best")
    gpu_task = np.array(m.apps) != "upload"
    on_slowed = np.array(m.node_names)[m.node_idx] == "worker-3"
    before, after = m.submit_s < onset, m.submit_s >= onset + 2 * SETTINGS.error_period_s
    assert on_slowed[gpu_task & before].mean() > 0.7
    assert on_slowed[gpu_task & after].mean() < 0.45  # the residual and the drift retrain moved the work away
    late = m.submit_s >= onset
    assert m.rtt_ms[late].mean() < 0.93 * table.rtt_ms[late].mean()
    assert m.rtt_ms[late].mean() < 1.08 * kube.rtt_ms[late].mean()


def test_a_cold_start_is_asked_once_the_samples_are_there_not_at_the_period_close():
    """Sample counts are checked every SAMPLE_CHECK_S: with a 60 s error period the first models still come
    within seconds (the trainer's verdict comes under 2 s after the ask)."""
    settings = Settings(error_period_s=60.0)
    m = run_offline(SimConfig(n_tasks=600), lambda rng: RttAware(rng, train_params=SMALL, settings=settings), seed=3)
    first = [t for t, _, reason in m.trace.retrains if reason == "cold_start"]
    assert first and min(first) < 10.0, m.trace.retrains[:5]
    assert not m.trace.errors or min(t for t, *_ in m.trace.errors) >= 60.0  # no period closed before


Due = tuple[str, float]  # (model key, the sample count its next retrain is due at)


def _asks(monkeypatch, cfg: SimConfig, reason: str) -> tuple[dict[Due, float], dict[Due, float]]:
    """Run ``cfg`` (seed 3); for retrains of ``reason`` (cold_start: keys without a model, growth: with one),
    per (key, count due), when a completion first brought the key's samples to that count and when the
    retrain was asked."""
    reached: dict[Due, float] = {}
    asked: dict[Due, float] = {}
    complete, ask = RttAware.observe_completion, RttAware._ask
    with_model = reason == "growth"

    def observe_completion(self, task, node, rtt_ms, view):
        def dues() -> dict[str, float]:  # taken before the completion, which may ask (and move them)
            return {k: self.growth.threshold(k, has_model=with_model) for k in self.samples_per_key
                    if (k in self.models) == with_model}

        before = dues()
        complete(self, task, node, rtt_ms, view)
        for key, due in {**dues(), **before}.items():
            if self.samples_per_key[key] >= due:
                reached.setdefault((key, due), view.now)

    def record(self, key, why, view, onset_ts):
        due = self.growth.threshold(key, has_model=key in self.models)
        sent = ask(self, key, why, view, onset_ts)
        if sent and why == reason:
            asked.setdefault((key, due), view.now)
        return sent

    monkeypatch.setattr(RttAware, "observe_completion", observe_completion)
    monkeypatch.setattr(RttAware, "_ask", record)
    run_offline(cfg, _factory, seed=3)
    return reached, asked


def test_sample_counts_are_checked_between_scrape_rounds(monkeypatch):
    """The worker's sample-check timer ticks every SAMPLE_CHECK_S whatever the scrape interval: with metrics
    scraped every 3 s the simulator checks at the completions in between, so a growth retrain is asked soon
    after the sample that calls for it, not at the next scrape round."""
    from app.drift.growth import SAMPLE_CHECK_S

    reached, asked = _asks(monkeypatch, SimConfig(n_tasks=1500, scrape_interval_s=3.0), "growth")
    both = sorted(set(asked) & set(reached))
    assert len(both) >= 3, (asked, reached)
    late = {k: round(asked[k] - reached[k], 3) for k in both}
    assert all(0.0 <= s <= 2 * SAMPLE_CHECK_S for s in late.values()), late  # the next tick, then a completion
    assert any(asked[k] % 3.0 > 1e-6 for k in both)  # asked between the scrape rounds


def test_a_model_serves_from_its_verdict_not_from_the_next_scrape_round(monkeypatch):
    """A verdict known between two scrape rounds (every 3 s here) is installed at the next placement (the
    extender takes a model-updates message when it arrives), not held until the next round."""
    late: list[float] = []
    ready = training.SimulatedTrainer.ready

    def record(self, now_s):
        done = ready(self, now_s)
        late.extend(now_s - d.due_s for d in done)
        return done

    monkeypatch.setattr(training.SimulatedTrainer, "ready", record)
    run_offline(SimConfig(n_tasks=1200, scrape_interval_s=3.0), _factory, seed=3)
    assert len(late) >= 4 and min(late) >= 0.0
    assert max(late) < 0.5 and float(np.mean(late)) < 0.15, late  # at the scrape rounds: up to 3 s late


def test_a_verdict_is_due_after_the_calibrated_delay_for_its_rows(monkeypatch):
    """The simulated trainer's verdict comes ``VerdictDelay(rows)`` after the ask: the base below the vote's
    500 fit rows, the vote's time from there, and a little more for each fit row (live measurements)."""
    monkeypatch.setattr(training, "_run", lambda *_args: (None, None))
    delay = training.VerdictDelay()
    assert delay(100) == pytest.approx(0.15 + 80 * 12e-6)
    assert delay(624) == pytest.approx(0.15 + 499 * 12e-6)  # 499 fit rows: no vote yet
    assert delay(625) == pytest.approx(0.15 + 0.55 + 500 * 12e-6)  # 500 fit rows: the vote runs
    assert delay(50_000) == pytest.approx(0.15 + 0.55 + 40_000 * 12e-6)
    assert training.VerdictDelay(vote_s=0.0, per_fit_row_s=0.0)(50_000) == 0.15
    with pytest.raises(ValueError, match="vote_s"):
        training.VerdictDelay(vote_s=-1.0)
    trainer = training.SimulatedTrainer(background=False)
    try:
        assert trainer.submit("gCTF:gpu", "cold_start", 10.0, _dataset(100), None)
        assert trainer.submit("upload:cpu", "growth", 10.0, _dataset(1_000), None)
        assert trainer.due_s == pytest.approx(10.0 + delay(100))
        assert [d.key for d in trainer.ready(10.0 + delay(100))] == ["gCTF:gpu"]
        assert trainer.due_s == pytest.approx(10.0 + delay(1_000)) and trainer.busy("upload:cpu")
    finally:
        trainer.close()
    fixed = training.SimulatedTrainer(delay_s=2.0, background=False)
    assert fixed.submit("gCTF:gpu", "cold_start", 10.0, _dataset(50_000), None) and fixed.due_s == 12.0


def test_the_trainer_counts_the_wall_time_a_due_verdict_waited_for(monkeypatch):
    """A verdict due while its retrain still runs holds the simulation until it is done: ``waited_s`` says how long
    and ``trained_s`` how long the retrains ran in their thread (bench_learning's speed table), and the run's trace
    carries both."""
    import threading

    release = threading.Event()

    def slow(*_args):
        release.wait(5.0)
        raise ValueError("no rows")  # delivered as a skipped retrain

    monkeypatch.setattr(training, "_run", slow)
    trainer = training.SimulatedTrainer(delay_s=1.0)
    try:
        assert trainer.due_s == float("inf")
        assert trainer.submit("gCTF:gpu", "cold_start", 10.0, _dataset(3), None)
        assert trainer.due_s == 11.0
        assert trainer.ready(10.5) == [] and trainer.waited_s == 0.0  # not due yet: no wait
        threading.Timer(0.3, release.set).start()
        done = trainer.ready(11.0)
        assert [d.detail for d in done] == ["no rows"] and 0.25 <= trainer.waited_s < 5.0
        assert 0.25 <= trainer.trained_s < 5.0  # held until the release, 0.3 s after the ask
    finally:
        release.set()
        trainer.close()
    sim = build_simulation(SimConfig(n_tasks=300), _factory, seed=7)
    sim.run()
    notes = sim.metrics().trace.notes
    assert notes["retrain_wait_s"] >= 0.0 and notes["retrain_s"] > 0.0 and sim.metrics().trace.retrains


def test_a_node_that_runs_tasks_before_its_first_scrape_is_tracked_with_its_class(monkeypatch):
    """A node that joins is scraped at the next round; the pods placed there before it complete as usual.
    Their completions make its tracker (errors, residuals, samples), and a model promoted meanwhile resets
    the trackers of its class, so the tracker must know the node's class from the completion, not wait for
    the node's metrics (this run ended in a KeyError when it did)."""
    first_scrape: dict[str, float] = {}
    before_scrape: list[float] = []
    installed: list[float] = []
    observe_metrics, observe_completion, install = (RttAware.observe_metrics, RttAware.observe_completion,
                                                    RttAware._install)

    def metrics(self, node, ts, values, view):
        first_scrape.setdefault(node, view.now)
        return observe_metrics(self, node, ts, values, view)

    def completion(self, task, node, rtt_ms, view):
        if node not in first_scrape:
            before_scrape.append(view.now)
        return observe_completion(self, task, node, rtt_ms, view)

    def record(self, done, view):
        installed.append(view.now)
        return install(self, done, view)

    monkeypatch.setattr(RttAware, "observe_metrics", metrics)
    monkeypatch.setattr(RttAware, "observe_completion", completion)
    monkeypatch.setattr(RttAware, "_install", record)
    sim = build_simulation(SimConfig(n_tasks=1500, scrape_interval_s=1000.0), _factory, seed=1)  # joins half-way
    sim.run()
    assert before_scrape and any(t > min(before_scrape) for t in installed)  # the case this test is about
    policy = sim.policy
    assert policy.specs["worker-join"].node_class == "gpu" and "worker-join" in policy.trackers
    assert sum(policy.trackers["worker-join"].weights_fields()["samples"].values()) > 0


def test_a_cold_start_is_asked_at_the_completion_that_reaches_the_count(monkeypatch):
    """As the worker does, a key without a model asks its first model at the sample that brings it to the
    cold-start count, not at the sample check after it (every 0.25 s)."""
    reached, asked = _asks(monkeypatch, SimConfig(n_tasks=800), "cold_start")
    assert len(asked) >= 3 and asked == reached, (asked, reached)


def test_the_simulated_trainer_judges_and_seeds_as_the_trainer_process():
    """The trainer process passes no seed (the pipeline's) and ``Settings.trainer_margin``; so does the sim."""
    import dataclasses
    import inspect

    from app.trainer import pipeline

    p = RttAware(np.random.default_rng(1), settings=dataclasses.replace(SETTINGS, trainer_margin=0.1))
    assert p.trainer.options["margin"] == 0.1
    assert p.trainer.options["seed"] == inspect.signature(pipeline.train_challenger).parameters["seed"].default


def test_node_weights_go_to_every_scraped_node_and_say_stale_as_the_worker_does():
    from app.sim.hardware import small_preset
    from app.sim.state import NodeRuntime
    from app.sim.view import ClusterView

    specs = small_preset()[:2]
    now = [0.0]
    view = ClusterView({s.name: NodeRuntime(s, i) for i, s in enumerate(specs)}, lambda: now[0], 1_700_000_000.0)
    p = RttAware(np.random.default_rng(1))
    for t in np.arange(0.0, 12.0, 1.0):
        now[0] = float(t)
        p.observe_metrics(specs[0].name, view.ts, {"cpu_util": 0.1}, view)
        if t < 4:  # the second node's metrics stop after 3 s
            p.observe_metrics(specs[1].name, view.ts, {"cpu_util": 0.1}, view)
        p.tick(view)
    nodes = p.snap.nodes
    assert set(nodes) == {specs[0].name, specs[1].name}
    assert nodes[specs[0].name].weight == SETTINGS.credibility_prior  # no completion yet: the prior
    stale_after = SETTINGS.stale_after_scrapes * SETTINGS.scrape_interval_s
    assert 11.0 - 3.0 > stale_after
    assert (nodes[specs[0].name].weights_stale, nodes[specs[1].name].weights_stale) == (False, True)
