"""What a node's window says in messages: its node-features value, and the training sample of a task it ran.

**node-features**: the window's aggregates, and each modelled app's over its DWA window.

Training samples are the node's features over the node × app DWA window before the task started
(``app/streams/feedback_join.py``), so a model of an app must be asked with the features over that
same window, not the node's default one. :func:`features_value` therefore adds, for every app whose
DWA window differs from the node's window and that has models (``app_names``: the feature names its
models read), ``app_features[app]``: those features aggregated over the app's window. The scheduler's
snapshot builder (:mod:`app.scheduler.builder`) gives a model of ``app`` the node's ``app_features[app]``
over its ``features``. Only the names models read travel, so the message stays small.

**training-samples** (:func:`sample_value`): the node's features over the node × app DWA window ending
when the task started, the task features the scheduler computed at decision time (the prediction's
``features``: ``running_pods_<app>``), and the task's time on the node
(:func:`app.contracts.completions.service_ms`). The worker's join and the simulator build them here.

>>> from app.features.window import NodeWindow
>>> w = NodeWindow(30.0, history_s=120.0)
>>> for t in range(100):
...     _ = w.update(1000.0 + t, {"cpu_iowait": float(t)})
>>> v = features_value("n1", 1099.0, "cpu", None, w, {"gCTF": 5.0, "upload": 30.0},
...                    {"gCTF": {"cpu_iowait__mean"}, "upload": {"cpu_iowait__mean"}})
>>> v["features"]["cpu_iowait__mean"], v["app_features"]
(84.5, {'gCTF': {'cpu_iowait__mean': 97.0}})
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from app.contracts.completions import service_ms
from app.contracts.keys import model_key
from app.features.window import NodeWindow


def features_value(node: str, ts: float, node_class: str | None, gpu_model: str | None, window: NodeWindow,
                   windows: Mapping[str, float], app_names: Mapping[str, Collection[str]] | None = None,
                   stale: Sequence[str] = ()) -> dict[str, Any]:
    """The node-features value (contract ``topics/node-features.json``).

    Parameters
    ----------
    window
        The node's window; its own length gives ``features``.
    windows
        DWA window per app (seconds).
    app_names
        Per app, the feature names its models read; apps absent here get no ``app_features``.
    """
    agg = window.aggregate()
    value: dict[str, Any] = {"node": node, "ts": ts, "node_class": node_class, "gpu_model": gpu_model,
                             "window_s": window.window_s, "windows": dict(windows), "count": agg.count,
                             "features": agg.features(), "stale": list(stale)}
    if app_names:
        extra: dict[str, dict[str, float]] = {}
        for app, w in windows.items():
            names = app_names.get(app)
            if not names or w == window.window_s:
                continue
            own = window.aggregate(window_s=w).features()
            picked = {n: own[n] for n in names if n in own}
            if picked:
                extra[app] = picked
        if extra:
            value["app_features"] = extra
    return value


def sample_value(completion: Mapping[str, Any], node_class: str, window: NodeWindow | None, gpu_model: str | None,
                 window_s: float, prediction: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The training-samples value of one completion (contract ``topics/training-samples.json``).

    ``window``: the node's window (None when the node has no metrics: no metric features).
    """
    features: dict[str, float] = {}
    if window is not None:
        features = window.aggregate(until_ts=completion["started_ts"], window_s=window_s).features()
    if prediction and prediction.get("features"):
        features.update(prediction["features"])  # what the scheduler knew at decision time (running pods)
    return {
        "model_key": model_key(completion["app"], node_class), "task_id": completion["task_id"],
        "app": completion["app"], "node": completion["node"], "node_class": node_class, "gpu_model": gpu_model,
        "started_ts": completion["started_ts"], "rtt_ms": service_ms(completion),
        "input_size_mb": completion.get("input_size_mb"), "window_s": window_s, "features": features,
        "predicted_rtt_ms": prediction["predicted_rtt_ms"] if prediction else None,
        "model_version": prediction["model_version"] if prediction else None,
    }
