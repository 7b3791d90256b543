"""DriftEpisode step by step on exact binary fractions: reference, opening, accumulated excess, re-signal, calm."""

from __future__ import annotations

import math

import pytest

from app.drift.episode import DriftEpisode


def opened(**kwargs: float) -> DriftEpisode:
    """Reference 0.25 (one period), then a detection at ts 100: delta 0.125, threshold 1.0 unless told."""
    ep = DriftEpisode(**{"delta": 0.125, "threshold": 1.0, **kwargs})  # type: ignore[arg-type]
    ep.update(0.25, detected=False)
    ep.update(0.75, detected=True, onset_ts=100.0)
    return ep


def test_reference_is_an_ewma_with_the_given_half_life() -> None:
    ep = DriftEpisode(half_life=1.0)  # each period moves the reference half-way
    assert ep.reference is None
    for x, ref in ((0.5, 0.5), (0.25, 0.375), (0.125, 0.25), (math.nan, 0.25), (math.inf, 0.25)):
        ep.update(x, detected=False)
        assert ep.reference == ref and not ep.open
    ep = DriftEpisode(half_life=2.0)
    ep.update(1.0, detected=False).update(0.0, detected=False)
    assert ep.reference == pytest.approx(2.0 ** -0.5)  # 1 - (1 - 2^(-1/2))


def test_a_detection_opens_an_episode_and_freezes_the_reference() -> None:
    ep = opened()
    assert ep.open and ep.excess == 0.0 and not ep.resignal and ep.onset_ts == 100.0
    assert ep.reference == 0.25  # the detected period does not move it
    ep.update(0.875, detected=False)
    assert ep.reference == 0.25 and ep.excess == 0.5
    ep.update(0.875, detected=True)  # the detector fired again: counted, but no second signal from here
    assert ep.excess == 1.0 and not ep.resignal


def test_the_excess_signals_again_once_past_the_threshold_and_restarts() -> None:
    ep = opened()
    signals = [ep.update(0.875, detected=False).resignal for _ in range(3)]  # excess 0.5 per period
    assert signals == [False, False, True]  # 1.0 is not past the threshold, 1.5 is
    assert ep.excess == 1.5 and ep.open
    ep.update(0.5, detected=False)  # the sum restarts after a re-signal
    assert not ep.resignal and ep.excess == 0.125
    ep = opened()
    for _ in range(2):
        ep.update(0.875, detected=False)
    assert ep.update(0.875, detected=True).resignal is False and ep.excess == 1.5


def test_calm_periods_in_a_row_close_the_episode() -> None:
    ep = opened(calm=2)
    ep.update(0.875, detected=False)
    ep.update(0.375, detected=False)  # exactly reference + delta: calm
    assert ep.open and ep.excess == 0.5
    ep.update(0.5, detected=False)  # above: the calm count starts again
    assert ep.open and ep.excess == 0.625
    ep.update(0.25, detected=False)
    assert ep.open
    ep.update(math.nan, detected=False)  # ignored, neither calm nor not
    assert ep.open
    ep.update(0.0, detected=False)
    assert not ep.open and ep.excess == 0.0 and ep.onset_ts is None
    ep.update(0.75, detected=False)  # closed: the reference follows the error again
    assert ep.reference == pytest.approx(0.25 + (1 - 2 ** (-1 / 12)) * 0.5)


def test_a_pending_resignal_clears_on_the_next_update_even_if_it_is_ignored() -> None:
    ep = opened(threshold=0.25)
    assert ep.update(0.875, detected=False).resignal
    ep.update(math.nan, detected=False)
    assert not ep.resignal and ep.excess == 0.0


def test_state_survives_to_dict_and_load() -> None:
    a = opened(calm=2)
    a.update(0.875, detected=False).update(0.25, detected=False)
    b = DriftEpisode(delta=0.125, threshold=1.0, calm=2).load(a.to_dict())
    assert b.to_dict() == a.to_dict() == {"reference": 0.25, "open": True, "excess": 0.5, "resignal": False,
                                          "onset_ts": 100.0, "calm": 1}
    assert not a.update(0.0, detected=False).open and not b.update(0.0, detected=False).open  # one calm left
    fresh = DriftEpisode().load({})
    assert fresh.to_dict() == DriftEpisode().to_dict()


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"delta": -1.0}, "delta"), ({"delta": math.inf}, "delta"), ({"threshold": 0.0}, "threshold"),
    ({"threshold": math.nan}, "threshold"), ({"calm": 0}, "calm"), ({"half_life": 0.0}, "half_life"),
    ({"half_life": math.inf}, "half_life"),
])
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DriftEpisode(**kwargs)  # type: ignore[arg-type]


def test_defaults_and_limit_settings() -> None:
    ep = DriftEpisode(delta=0.0, calm=1)  # both limits are allowed
    ep.update(0.25, detected=False).update(1.0, detected=True)
    assert ep.update(0.25, detected=False).open is False  # one calm period closes it
    d = DriftEpisode()  # documented defaults: delta 0.02, threshold 0.5, calm 3
    assert (d.delta, d.threshold, d.calm) == (0.02, 0.5, 3)


def test_calm_count_starts_at_zero_and_an_exact_reference_is_calm() -> None:
    ep = opened(calm=2)
    ep.update(0.375, detected=False)  # exactly reference + delta
    assert ep.open and ep.to_dict()["calm"] == 1 and ep.excess == 0.0


def test_an_episode_opened_before_any_reference_measures_from_zero() -> None:
    ep = DriftEpisode(delta=0.125, threshold=1.0)
    ep.update(0.75, detected=True)  # the first period is already a detection
    assert ep.open and ep.reference is None
    ep.update(0.625, detected=False)
    assert ep.excess == 0.5


def test_a_pending_resignal_survives_a_restart() -> None:
    a = opened(threshold=0.25)
    assert a.update(0.875, detected=False).resignal
    b = DriftEpisode(delta=0.125, threshold=0.25).load(a.to_dict())
    assert b.resignal and b.excess == a.excess == 0.5
    assert not b.update(0.25, detected=False).resignal
