"""NodeTracker.forget: an app retired from the worker leaves every per-app state; the node's credibility stays."""

from __future__ import annotations

from app.drift.tracker import NodeTracker


def tracker() -> NodeTracker:
    t = NodeTracker(20.0)
    for app, actual in (("gCTF", 150.0), ("upload", 90.0)):
        for _ in range(5):
            t.add(app, 100.0, actual)
            t.count_sample(app)
    t.close(10.0)
    return t


def test_forget_drops_the_apps_named_and_keeps_the_rest() -> None:
    t = tracker()
    weight, upload = t.weight, t.weights_fields()["correction"]["upload"]
    assert weight != 0.5 and t.correction("gCTF") != 1.0
    assert t.forget(["gCTF", "never-seen"]) is True
    assert set(t.apps) == {"upload"}
    assert (t.samples("gCTF"), t.correction("gCTF"), t.window("gCTF")) == (0, 1.0, 20.0)
    fields = t.weights_fields()
    assert fields["samples"] == {"upload": 5} and fields["correction"] == {"upload": upload}
    assert t.weight == weight  # the credibility is the node's, over all apps


def test_forget_of_apps_not_kept_changes_nothing_and_says_so() -> None:
    t = tracker()
    before = t.to_dict()
    assert t.forget(["never-seen"]) is False and t.forget([]) is False
    assert t.to_dict() == before
    assert t.forget(["gCTF", "upload"]) is True and t.apps == {}
    assert t.forget(["gCTF"]) is False
