"""Which app a pod is: label, annotation, task id, and wrong JSON types."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduler.podinfo import APP_LABEL, INPUT_SIZE_ANNOTATION, PodError, pod_info

KUBE = Path(__file__).resolve().parents[2] / "fixtures" / "kube"


def test_realistic_pods_from_the_scheduler() -> None:
    gctf = pod_info(json.loads((KUBE / "pod_gctf.json").read_text()))
    assert (gctf.app, gctf.input_size_mb, gctf.namespace) == ("gCTF", 512.0, "cryoem")
    assert gctf.task_id == "0b7d3f52-91c4-4a7e-bb0e-2f5e4d6c8a10"
    assert gctf.task_features() == {"task_input_size_mb": 512.0}
    web = pod_info(json.loads((KUBE / "pod_unlabeled.json").read_text()))
    assert web.app is None and math.isnan(web.input_size_mb)


@pytest.mark.parametrize("raw", ["", "abc", "-3", "nan", "inf", None, 12, "1e39"])
def test_unusable_input_size_is_missing(raw: object) -> None:
    p = pod_info({"metadata": {"labels": {APP_LABEL: "gCTF"}, "annotations": {INPUT_SIZE_ANNOTATION: raw}}})
    assert p.app == "gCTF" and math.isnan(p.input_size_mb)


@pytest.mark.parametrize("label", ["", 7, "x" * 65, None])
def test_unusable_app_label_means_not_ours(label: object) -> None:
    assert pod_info({"metadata": {"labels": {APP_LABEL: label}}}).app is None


def test_task_id_falls_back_to_namespace_and_name() -> None:
    assert pod_info({"metadata": {"name": "p", "namespace": "ns"}}).task_id == "ns/p"


@pytest.mark.parametrize("pod", [[], "pod", {"metadata": []}, {"metadata": {"labels": ["a"]}},
                                 {"metadata": {"annotations": 3}}, {"metadata": {"name": 5}}])
def test_wrong_json_types_raise_pod_error(pod: object) -> None:
    with pytest.raises(PodError):
        pod_info(pod)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["metadata", "spec"]),
                       json_values | st.fixed_dictionaries({"labels": json_values, "annotations": json_values})))
def test_any_json_is_a_pod_or_a_pod_error(pod: dict) -> None:
    try:
        info = pod_info(pod)
    except PodError:
        return
    assert info.app is None or isinstance(info.app, str)
    assert math.isnan(info.input_size_mb) or info.input_size_mb >= 0


def test_the_largest_float32_size_is_kept_and_one_beyond_is_missing() -> None:
    import numpy as np

    from app.scheduler.podinfo import FLOAT32_MAX

    assert FLOAT32_MAX == float(np.finfo(np.float32).max)
    for raw, usable in ((repr(FLOAT32_MAX), True), ("3.5e38", False)):
        p = pod_info({"metadata": {"labels": {APP_LABEL: "gCTF"}, "annotations": {INPUT_SIZE_ANNOTATION: raw}}})
        assert math.isnan(p.input_size_mb) is not usable
        if usable:  # what a float32 feature row holds: no overflow to inf
            assert np.isfinite(np.float32(p.input_size_mb))
