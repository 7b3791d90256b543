"""The feedback state of one node: per app the period's errors, a drift detector, a DWA window, a residual
correction and a sample count; a credibility.

Fed with (predicted, actual) pairs as predictions are joined with completions, and closed once per error
period. Each pair also moves the app's :class:`~app.drift.residual.Residual` (from the *model's* prediction,
before the correction the scheduler applied), and each completed task counts as one sample of the app on
the node (:meth:`NodeTracker.count_sample`). Closing a period, for each app that had pairs in it:

1. its :class:`~app.drift.errorstats.ErrorStats` give the figures of the prediction-errors entry;
2. the period's RMSE moves the app's :class:`~app.drift.dwa.DynamicWindow` (DWA);
3. the period's MAPE feeds the app's cumulative-error detector (:class:`~app.drift.pagehinkley.PageHinkley`
   by default), whose statistic is the entry's ``cumulative``, and its
   :class:`~app.drift.episode.DriftEpisode`, which reports the drift again while the error stays above
   its pre-drift reference (the detector itself restarts after an alarm);

and the node's :class:`~app.drift.credibility.Credibility` is fed with the period's MAPE over all apps.
An app with no pairs in a period is left alone (no error is not a small error). The period's sums,
the credibility, the DWA windows, the drift detectors and episodes, the residuals and the sample counts
round-trip through plain dicts (:meth:`NodeTracker.to_dict`, :meth:`NodeTracker.load`), so a restarted
worker keeps its references. :meth:`NodeTracker.weights_fields` is what node-weights carries of it.

>>> t = NodeTracker(initial_window_s=30.0)
>>> for p, a in [(100.0, 110.0), (200.0, 180.0)]:
...     t.add("gCTF", p, a)
>>> r = t.close(ts=1000.0)["gCTF"]
>>> (r.stats["n"], r.stats["rmse_ms"], round(r.cumulative, 3), r.window_s, r.drift)
(2, 15.811, 0.0, 30.0, False)
>>> round(t.weight, 4)
0.5363
>>> t.close(ts=1005.0)
{}
>>> t.add("gCTF", 150.0, 300.0, model_ms=100.0)  # the model said 100 ms, corrected to 150
>>> t.count_sample("gCTF")
>>> f = t.weights_fields(); round(f["correction"]["gCTF"], 3), f["samples"]
(1.379, {'gCTF': 1})
>>> t.forget({"gCTF"}), t.weights_fields()["samples"], t.window("gCTF")  # an app retired: back to the start
(True, {}, 30.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from app.drift.base import DriftDetector
from app.drift.credibility import Credibility
from app.drift.dwa import DynamicWindow
from app.drift.episode import DriftEpisode
from app.drift.errorstats import ErrorStats
from app.drift.pagehinkley import PageHinkley
from app.drift.residual import Residual


@dataclasses.dataclass(frozen=True)
class AppReport:
    """One app's closed period on one node."""

    stats: dict[str, Any]  # ErrorStats.summary(): n, rmse_ms, mae_ms, mape, bias_ms
    cumulative: float
    threshold: float
    drift: bool
    onset_ts: float | None
    window_s: float
    errors: ErrorStats = dataclasses.field(default_factory=ErrorStats, repr=False)  # the period's sums


class _AppState:
    __slots__ = ("detector", "dwa", "episode", "period", "residual", "samples")

    def __init__(self, detector: DriftDetector, dwa: DynamicWindow, episode: DriftEpisode, residual: Residual) -> None:
        self.period = ErrorStats()
        self.detector = detector
        self.dwa = dwa
        self.episode = episode
        self.residual = residual
        self.samples = 0


class NodeTracker:
    """Errors, drift detectors, DWA windows and credibility of one node.

    Parameters
    ----------
    initial_window_s
        DWA window of an app before its first evaluation (clamped into ``[min_window_s, max_window_s]``).
    min_window_s, max_window_s
        DWA bounds.
    prior
        Credibility of a node never evaluated.
    detector
        Factory of one app's drift detector (default :class:`PageHinkley` with its documented defaults).
    episode
        Factory of one app's :class:`~app.drift.episode.DriftEpisode`: while the error stays above its
        pre-drift reference after a detection, the drift is reported again (``AppReport.drift``).
    residual
        Factory of one app's :class:`~app.drift.residual.Residual`.
    """

    def __init__(self, initial_window_s: float = 30.0, *, min_window_s: float = 5.0, max_window_s: float = 60.0,
                 prior: float = 0.5, detector: Callable[[], DriftDetector] = PageHinkley,
                 episode: Callable[[], DriftEpisode] = DriftEpisode,
                 residual: Callable[[], Residual] = Residual) -> None:
        self.initial_window_s = initial_window_s
        self.min_window_s = min_window_s
        self.max_window_s = max_window_s
        self.detector = detector
        self.episode = episode
        self.residual = residual
        self.credibility = Credibility(prior=prior)
        self.apps: dict[str, _AppState] = {}

    @classmethod
    def configured(cls, *, window_s: float, min_window_s: float, max_window_s: float, prior: float,
                   drift_delta: float, drift_threshold: float, drift_min_instances: int,
                   drift_jump: float) -> NodeTracker:
        """A tracker with the feedback loop's settings (``RTT_FEATURE_WINDOW_S``, ``RTT_DWA_*``,
        ``RTT_CREDIBILITY_PRIOR``, ``RTT_DRIFT_*``): what the worker and the simulator both build."""

        def detector() -> PageHinkley:
            return PageHinkley(delta=drift_delta, threshold=drift_threshold, min_instances=drift_min_instances,
                               jump=drift_jump or None)

        def episode() -> DriftEpisode:
            return DriftEpisode(delta=drift_delta, threshold=drift_threshold)

        return cls(window_s, min_window_s=min_window_s, max_window_s=max_window_s, prior=prior, detector=detector,
                   episode=episode)

    def _app(self, app: str, window_s: float | None = None) -> _AppState:
        s = self.apps.get(app)
        if s is None:
            initial = self.initial_window_s if window_s is None else window_s
            dwa = DynamicWindow(self.min_window_s, self.max_window_s, initial_s=initial)
            s = self.apps[app] = _AppState(self.detector(), dwa, self.episode(), self.residual())
        return s

    def add(self, app: str, predicted: float, actual: float, *, model_ms: float | None = None,
            residual: bool = True) -> None:
        """One joined pair of this period: the published prediction and the observed RTT (ms).

        ``model_ms``: the model's own prediction when the published one carried a correction (None: the
        same); ``residual=False`` leaves the residual alone (a prediction of a model no longer serving).
        """
        s = self._app(app)
        s.period.update(predicted, actual)
        if residual:
            s.residual.update(predicted if model_ms is None else model_ms, actual)

    def count_sample(self, app: str) -> None:
        """One completed task of ``app`` on this node (matched with a prediction or not)."""
        self._app(app).samples += 1

    def samples(self, app: str) -> int:
        s = self.apps.get(app)
        return s.samples if s is not None else 0

    def correction(self, app: str) -> float:
        """The app's residual factor on this node (1.0 when none)."""
        s = self.apps.get(app)
        return s.residual.factor if s is not None else 1.0

    def reset_detector(self, app: str) -> bool:
        """Start the app's detector afresh (a new model serves: its error is the new reference)."""
        s = self.apps.get(app)
        if s is None:
            return False
        s.detector = self.detector()
        return True

    def new_model(self, app: str) -> bool:
        """A new model of ``app`` serves this node: its detector and residual start afresh."""
        s = self.apps.get(app)
        if s is None:
            return False
        s.detector = self.detector()
        s.residual.reset()
        return True

    def forget(self, apps: Collection[str]) -> bool:
        """Drop everything kept of ``apps`` (retired from the worker); True if any was kept. The credibility,
        over all apps, stays."""
        gone = [app for app in apps if app in self.apps]
        for app in gone:
            del self.apps[app]
        return bool(gone)

    def weights_fields(self) -> dict[str, Any]:
        """What node-weights carries of this node's feedback: ``weight`` (credibility), ``correction`` (the
        residual factor of every app with a residual) and ``samples`` (completed tasks per app)."""
        return {"weight": self.weight,
                "correction": {app: s.residual.factor for app, s in self.apps.items() if s.residual.n},
                "samples": {app: s.samples for app, s in self.apps.items() if s.samples}}

    def window(self, app: str) -> float:
        """The app's DWA window (the initial one for an app never evaluated)."""
        s = self.apps.get(app)
        return s.dwa.window_s if s is not None else min(max(self.initial_window_s, self.min_window_s),
                                                         self.max_window_s)

    def windows(self) -> dict[str, float]:
        return {app: s.dwa.window_s for app, s in self.apps.items()}

    @property
    def weight(self) -> float:
        return self.credibility.weight

    def pending(self) -> int:
        """Pairs in the open period."""
        return sum(s.period.n for s in self.apps.values())

    def close(self, ts: float) -> dict[str, AppReport]:
        """Close the period: reports of the apps that had pairs; the period restarts empty."""
        out: dict[str, AppReport] = {}
        total = ErrorStats()
        for app, s in self.apps.items():
            p = s.period
            if p.n == 0:
                continue
            s.period = ErrorStats()
            total = total + p
            s.dwa.update(p.rmse_ms)
            d = s.detector.update(p.mape, ts)
            ep = s.episode.update(p.mape, detected=d.drift_detected, onset_ts=d.onset_ts)
            if ep.resignal:  # the error stayed above the pre-drift reference: the drift persists
                out[app] = AppReport(p.summary(), ep.excess, ep.threshold, True, ep.onset_ts, s.dwa.window_s, p)
            else:
                out[app] = AppReport(p.summary(), d.cumulative, d.threshold, d.drift_detected, d.onset_ts,
                                     s.dwa.window_s, p)
        if total.n:
            self.credibility.update(total.mape, total.n)
        return out

    # -- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        apps = {app: {"period": s.period.to_dict(), "window_s": s.dwa.window_s, "rmse": s.dwa.last_rmse,
                      "detector": s.detector.to_dict(), "episode": s.episode.to_dict(),
                      "residual": s.residual.to_dict(), "samples": s.samples}
                for app, s in self.apps.items()}
        return {"credibility": self.credibility.to_dict(), "apps": apps}

    def load(self, state: Mapping[str, Any]) -> NodeTracker:
        """Restore what :meth:`to_dict` wrote, drift detectors and episodes included."""
        self.credibility.load(state.get("credibility") or {})
        for app, a in (state.get("apps") or {}).items():
            s = self._app(app, float(a["window_s"]))
            s.period = ErrorStats.from_dict(a.get("period") or {})
            rmse = a.get("rmse")
            if rmse is not None:
                s.dwa.update(float(rmse))  # sets the reference RMSE; the first update never moves the window
            if a.get("detector"):
                s.detector.load(a["detector"])
            if a.get("episode"):
                s.episode.load(a["episode"])
            if a.get("residual"):
                s.residual.load(a["residual"])
            s.samples = int(a.get("samples", 0))
        return self
