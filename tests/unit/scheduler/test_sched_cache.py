"""Redis key layout (pure part; the round trip against a real redis is in the integration tests)."""

from __future__ import annotations

import pytest

from app.errors import ContractError
from app.scheduler.cache import CacheKeys, decode_running, encode_running


def test_key_layout_is_namespaced_and_parseable() -> None:
    k = CacheKeys("t1-")
    assert k.features("n1") == "rttsched:t1-features:n1"
    assert k.weights("n1") == "rttsched:t1-weights:n1"
    assert k.running("n1") == "rttsched:t1-running:n1"
    assert k.model_update("gCTF:gpu:n1") == "rttsched:t1-model-updates:gCTF:gpu:n1"
    assert k.pattern("features") == "rttsched:t1-features:*"
    assert k.kind_of(k.model_update("gCTF:gpu:n1")) == ("model-updates", "gCTF:gpu:n1")
    with pytest.raises(ValueError):
        CacheKeys("t2-").kind_of(k.features("n1"))
    assert CacheKeys().features("n1") == "rttsched:features:n1"


def test_running_apps_round_trip_and_rejects() -> None:
    assert decode_running(encode_running({"gCTF": 2}, ts=5.0)) == {"gCTF": 2}
    for raw in (b"nope", b"{}", b'{"apps": [1]}', b'{"apps": {"a": "x"}}'):
        with pytest.raises(ContractError):
            decode_running(raw)
