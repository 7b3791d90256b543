"""What every figure of the report is called and what it means (the report prints these definitions).

The figures themselves are computed by :meth:`app.sim.results.RunMetrics.summary`; this module only names them.

>>> LABELS["p95_rtt_ms"], "completed" in DEFINITIONS["mean_rtt_ms"]
('p95 ms', True)
>>> label("acc:gCTF:gpu")
'1 − MAPE gCTF on gpu'
"""

from __future__ import annotations

LABELS = {
    "mean_rtt_ms": "mean RTT ms", "p95_rtt_ms": "p95 ms", "p99_rtt_ms": "p99 ms", "rtt_std_ms": "RTT std ms",
    "queue_ms": "queue ms", "queue_p99_ms": "queue p99 ms", "throughput": "tasks/s", "gpu_util": "GPU busy",
    "gpu_demand": "GPU demand", "load_diff": "load diff pp", "load_std": "load std pp", "sla": "SLA met",
    "retrains": "retrains", "tasks": "tasks done", "failed": "failed", "makespan_s": "makespan s",
    "live_pace": "live tasks/s wall", "sim_speed": "sim tasks/s wall",
    "acc": "1 − MAPE (accuracy)", "interval": "± (interval)", "change": "change", "rolling": "rolling mean and p95",
    "credibility": "credibility (node weight)", "dwa": "DWA window",
}

DEFINITIONS = {
    "RTT": "response time of one task: finish − arrival (queueing, pending and service included), in ms.",
    "mean_rtt_ms": "mean RTT over the completed tasks of a run.",
    "p95_rtt_ms": "95th percentile of RTT over the completed tasks (numpy's linear interpolation).",
    "p99_rtt_ms": "99th percentile of RTT over the completed tasks.",
    "rtt_std_ms": "standard deviation of RTT over the completed tasks (how evenly tasks are served).",
    "queue_ms": "mean time from arrival to start: waiting for a free slot, pending included.",
    "queue_p99_ms": "99th percentile of the time from arrival to start.",
    "throughput": "completed tasks per simulated second: first arrival to last finish in an open loop; "
                  "tasks finished within the submission window in a closed loop.",
    "gpu_util": "fraction of time each GPU runs at least one task, averaged over a node's GPUs, then over GPU "
                "nodes, from the node's join to the run's end (makespan).",
    "gpu_demand": "time-averaged compute demand of the tasks on GPU nodes (0..1), beside GPU busy.",
    "load_diff": "max − min over nodes of each node's utilisation (GPU nodes: GPU busy; CPU nodes: fraction of "
                 "time running at least one task), in percentage points.",
    "load_std": "standard deviation of the same per-node utilisation, in percentage points.",
    "sla": "fraction of completed tasks whose RTT met their app's SLA (the config's sla_ms).",
    "retrains": "model retrains the policy triggered (cold start, drift, growth).",
    "tasks": "tasks that completed in a run.",
    "failed": "tasks of a run that never completed: no node could run them (too large for every node, or every "
              "node that could had left), or still waiting when nothing could change any more. Every other figure "
              "is over the completed tasks only.",
    "makespan_s": "simulated seconds from the start of a run to its end: the first metrics scrape after the "
                  "last task finished or failed (node events scripted later are not run).",
    "mean_rtt_ms:<app>": "mean RTT over the completed tasks of one app.",
    "acc": "prediction accuracy 1 − MAPE per app and node class, over the tasks after the warm-up (the first "
           "20 % of tasks) that carry a prediction; MAPE = mean(|predicted − observed| / observed).",
    "live_pace": "live rows only: tasks placed and run per wall-clock second (the live run paces the simulated "
                 "cluster in real time × speed, so this is the workload's rate, not a speed).",
    "sim_speed": "offline rows only: tasks the discrete-event simulator ran per wall-clock second (how fast the "
                 "harness is; nothing to do with the placement).",
    "interval": "± is the half-width of the 95 % Student-t confidence interval of the mean over seeds; shown only "
                "with two or more seeds.",
    "change": "relative change of the row's seed mean against the baseline's: row / baseline − 1.",
    "rolling": "over time: the mean and the 95th percentile of RTT of the tasks that arrived in a sliding window "
               "of simulated time, plotted at the window's end.",
    "credibility": "node weight in node-weights: how far the scheduler trusts a node's predictions (0..1); "
                   "scores are pulled toward neutral as it falls.",
    "dwa": "dynamic window adjustment: per node × app feature window, ×1.5 when RMSE rose > 15 %, ×0.8 when it "
           "fell > 10 %, within its bounds.",
}


def label(figure: str) -> str:
    """The column name of ``figure`` (accuracy keys ``acc:<app>:<class>`` spelled out)."""
    if figure.startswith("acc:"):
        _, app, cls = figure.split(":", 2)
        return f"1 − MAPE {app} on {cls}"
    if figure.startswith("mean_rtt_ms:"):
        return f"mean RTT ms {figure.split(':', 1)[1]}"
    return LABELS.get(figure, figure)

POLICIES = {
    "kube_default": "Kubernetes' default scoring (NodeResourcesFit LeastAllocated + BalancedAllocation on the "
                    "pods' requests), as kube-scheduler computes it.",
    "load_aware": "Trimaran LoadVariationRiskBalancing on a load-watcher's averages, added to the default profile.",
    "target_load": "Trimaran TargetLoadPacking (target 40 % CPU) on a load-watcher's averages.",
    "load_aware_tuned": "load_aware with the load-watcher's timing scaled to the run's time scale and the plugin's "
                        "margin and sensitivity chosen on held-out seeds, as an operator would tune it.",
    "target_load_tuned": "target_load with the load-watcher's timing scaled to the run's time scale and the target "
                         "utilisation chosen on held-out seeds, as an operator would tune it.",
    "static_best": "a hand-tuned table an operator writes: each hardware class calibrated once, idle, per app "
                   "and input size, with one contention factor; the task goes where the table says is fastest.",
    "round_robin": "the next node in turn.",
    "random": "a node drawn at random.",
    "rtt_aware": "this project: the extender's decision on models learnt online from the run's own completions.",
    "clairvoyant": "a reference, not a competitor: it knows each task's true work and every running task's state, "
                   "which no scheduler can, and ranks by RTT alone; a policy can beat it.",
}
"""What each policy row is (the report prints these beside the figures' definitions)."""

