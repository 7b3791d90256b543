"""A training sample checked against the training-samples contract before the worker sends it.

The trainer, and any other consumer, refuses a sample that breaks the contract (``topics/training-samples.json``):
more than 1,600 features, a feature name outside the rule of :mod:`app.contracts.names`, a number out of bounds,
a NaN (written as ``null``). The worker's own bounds keep a sample within the counts, but a name can still be one
the contract refuses: a metric name an exporter gave, kept in a node's window restored from a changelog an older
release wrote, or a task feature. So the join checks every sample it makes and sends one that fails to dead letters
instead (:mod:`app.streams.feedback_join`).

Every ``ok`` completion makes a sample, so the check is on the worker's busy path and does not read the bytes
again: the value is converted to the msgspec type the contract's fast decoder uses
(:meth:`app.contracts.edge.EdgeDecoder.conforms`, at least as strict as the schema: ~10 µs for a sample of 150
features, where the reference takes ~100 µs), and the feature names are checked by the contract's own rule, which
remembers the names it found valid before (:class:`app.contracts.loader.NameRule`: ~3 µs). What that refuses is
checked by the reference (:func:`app.contracts.decode`, strict, on the encoded bytes: what a consumer reads), so the
error and its reason are the contract's, and a value the faster pass refuses but the contract takes is taken.

>>> from app.contracts import encode
>>> check = SampleCheck()
>>> v = {"model_key": "gCTF:gpu", "task_id": "t1", "app": "gCTF", "node": "n1", "node_class": "gpu",
...      "started_ts": 1.0, "rtt_ms": 5.0, "window_s": 10.0, "features": {"gpu_util__mean": 3.0}}
>>> check(v, encode(TOPIC, v, check=False)) is None
True
>>> v["features"]["gpu_util[0]__mean"] = 4.0
>>> print(check(v, encode(TOPIC, v, check=False)))
schema: data.features must be named by propertyName definition: 'gpu_util[0]__mean' is not a feature name: ...
"""

from __future__ import annotations

from typing import Any

from app.contracts import decode
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError

TOPIC = "training-samples"


class SampleCheck:
    """``check(value, raw)``: None when a consumer takes the sample ``value`` encoded as ``raw``, else the
    contract's :class:`~app.errors.ContractError` (see the module)."""

    def __init__(self) -> None:
        self._edge = EdgeDecoder(TOPIC)  # its typed pass and the names' rules, on the value as it is

    def __call__(self, value: dict[str, Any], raw: bytes) -> ContractError | None:
        if self._edge.conforms(value):
            return None
        try:
            decode(TOPIC, raw, strict=True)
        except ContractError as exc:
            return exc
        return None
