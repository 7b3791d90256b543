"""Page-Hinkley and CUSUM step by step on exact binary fractions: every boundary, the reset, the saved state."""

from __future__ import annotations

import json
import math
import random

import pytest

from app.drift.cusum import Cusum
from app.drift.growth import COLD_START, SampleGrowth
from app.drift.pagehinkley import PageHinkley


def test_page_hinkley_fires_from_min_instances_on_and_only_past_the_threshold() -> None:
    # alpha 1, delta 0: after 0 then 1 the mean is 0.5 and m = 1 - 0.5 = 0.5 above its minimum 0
    fired = PageHinkley(delta=0.0, threshold=0.25, alpha=1.0, min_instances=2, jump=None)
    assert not fired.update(0.0).drift_detected and fired.update(1.0).drift_detected
    assert fired.rule == "page_hinkley" and fired.cumulative == 0.5 and fired.threshold == 0.25
    assert fired.onset_ts == 0.0
    at = PageHinkley(delta=0.0, threshold=0.5, alpha=1.0, min_instances=2, jump=None)
    assert at.update(0.0).update(1.0).drift_detected is False and at.cumulative == 0.5  # equal is not past
    assert at.rule is None
    early = PageHinkley(delta=0.0, threshold=0.25, alpha=1.0, min_instances=3, jump=None)
    assert early.update(0.0).update(1.0).drift_detected is False  # 2 windows < min_instances


def test_page_hinkley_onset_moves_to_the_latest_window_at_the_minimum() -> None:
    ph = PageHinkley(delta=0.0, jump=None)
    for i in range(5):
        ph.update(0.5, ts=100.0 + i)  # m stays exactly at its minimum 0
    assert ph.cumulative == 0.0 and ph.onset_ts == 104.0
    ph = PageHinkley(delta=0.0, jump=None)
    ph.update(0.5).update(0.5)
    assert ph.onset_ts == 1.0  # without times: the index


def test_level_shift_needs_the_reference_windows_before_it() -> None:
    def shifted(min_instances: int) -> PageHinkley:
        ph = PageHinkley(threshold=100.0, min_instances=min_instances, jump=0.25, jump_sigmas=0.0)
        for _ in range(3):
            ph.update(0.0)
        return ph.update(1.0)

    assert shifted(3).rule == "level_shift" and shifted(3).cumulative == pytest.approx(0.98)  # 1 - 0 - delta
    assert not shifted(4).drift_detected


def test_level_shift_limit_is_jump_or_sigmas_times_the_sample_sd() -> None:
    def after(x: float, jump_sigmas: float = 1.0, jump: float = 0.01) -> PageHinkley:
        ph = PageHinkley(delta=0.0, threshold=100.0, min_instances=2, jump=jump, jump_sigmas=jump_sigmas)
        return ph.update(0.0).update(1.0).update(x)  # mean 0.5, sample sd sqrt(0.5) = 0.7071

    assert not after(0.5 + 0.70).drift_detected
    shot = after(0.5 + 0.71)
    assert shot.rule == "level_shift" and shot.threshold == pytest.approx(math.sqrt(0.5))
    assert shot.cumulative == pytest.approx(0.71)
    exact = PageHinkley(delta=0.0, threshold=100.0, min_instances=1, jump=0.5, jump_sigmas=0.0)
    assert not exact.update(0.25).update(0.75).drift_detected  # excess 0.5 equals the limit: not past it
    one = PageHinkley(delta=0.0, threshold=100.0, min_instances=1, jump=0.25)
    assert one.update(0.1).update(0.5).rule == "level_shift"  # after one window the sd is 0, not undefined


def test_a_detector_after_an_alarm_is_fresh() -> None:
    for d in (PageHinkley(min_instances=1, jump=0.25), Cusum(min_instances=1, threshold=0.25)):
        assert d.update(0.0).update(1.0).drift_detected
        d.update(0.0)
        assert d.drift_detected is False and d.n == 1 and d.cumulative == 0.0
        assert getattr(d, "rule", None) is None


def test_cusum_reference_warm_up_boundaries() -> None:
    c = Cusum(k=0.0, threshold=0.5, min_instances=2)
    c.update(0.25, ts=10.0).update(0.75, ts=11.0)
    assert c.reference == 0.5 and c.cumulative == 0.0 and c.onset_ts == 11.0
    c.update(1.0, ts=12.0)  # S = 0.5: equal to the threshold, not past it
    assert c.cumulative == 0.5 and not c.drift_detected and c.onset_ts == 11.0
    c.update(0.75, ts=13.0)
    assert c.drift_detected and c.cumulative == 0.75 and c.onset_ts == 11.0
    c = Cusum(k=0.0, min_instances=2)
    c.update(0.25).update(0.25).update(0.0)
    assert c.onset_ts == 2.0 and c.cumulative == 0.0  # at zero: the onset follows; index without times
    assert Cusum(min_instances=1).update(0.5).reference == 0.5


@pytest.mark.parametrize("make", [
    lambda: PageHinkley(), lambda: PageHinkley(jump=0.1, jump_sigmas=2.0), lambda: Cusum(),
])
def test_saved_state_resumes_exactly(make) -> None:
    rng = random.Random(4)
    stream = [rng.gauss(0.1, 0.04) for _ in range(30)] + [0.6] + [rng.gauss(0.3, 0.04) for _ in range(10)]
    for cut in (0, 5, 30, 31, 35):
        a, b = make(), make()
        for i, x in enumerate(stream[:cut]):
            a.update(x, ts=float(i))
        b.load(json.loads(json.dumps(a.to_dict())))  # through JSON, as the worker keeps it
        assert b.to_dict() == a.to_dict()
        assert (b.drift_detected, b.cumulative, b.threshold, b.onset_ts, b.n) == \
               (a.drift_detected, a.cumulative, a.threshold, a.onset_ts, a.n)
        for i, x in enumerate(stream[cut:], start=cut):
            assert a.update(x, ts=float(i)).to_dict() == b.update(x, ts=float(i)).to_dict()
    assert make().load({}).to_dict() == make().to_dict()


@pytest.mark.parametrize(("make", "field"), [
    (lambda: PageHinkley(delta=-0.1), "delta"), (lambda: PageHinkley(threshold=0.0), "threshold"),
    (lambda: PageHinkley(alpha=1.01), "alpha"), (lambda: PageHinkley(min_instances=0), "min_instances"),
    (lambda: PageHinkley(jump=-1.0), "jump"), (lambda: PageHinkley(jump_sigmas=math.inf), "jump_sigmas"),
    (lambda: Cusum(k=-0.1), "k"), (lambda: Cusum(threshold=0.0), "threshold"),
    (lambda: Cusum(min_instances=0), "min_instances"),
    (lambda: SampleGrowth(cold_start=0, growth=0.5), "cold_start"), (lambda: SampleGrowth(10, -1.0), "growth"),
])
def test_bad_settings_name_the_field(make, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        make()


def test_limit_settings_are_accepted() -> None:
    PageHinkley(delta=0.0, alpha=1.0, min_instances=1, jump_sigmas=0.0)
    PageHinkley(jump_sigmas=0.5)
    Cusum(k=0.0, min_instances=1)
    assert SampleGrowth(cold_start=1, growth=0.0).due("k", 1, has_model=False) == COLD_START


@pytest.mark.parametrize("make", [lambda: Cusum(min_instances=1, threshold=0.25),
                                  lambda: PageHinkley(min_instances=1, jump=0.25)])
def test_an_alarm_survives_a_restart_and_the_next_update_starts_afresh(make) -> None:
    a = make().update(0.0).update(1.0)
    assert a.drift_detected
    b = make().load(json.loads(json.dumps(a.to_dict())))
    assert b.drift_detected is True and b.cumulative == a.cumulative
    assert b.update(0.0).n == 1 and not b.drift_detected
