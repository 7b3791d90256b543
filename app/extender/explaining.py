"""``POST /explain``: the body of ``/prioritize`` plus optional ``Explain`` options, answered with JSON.

The body is an ExtenderArgs (``Pod`` and ``NodeNames`` or ``Nodes``), as kube-scheduler sends to
``/prioritize``; an optional top-level ``Explain`` object sets how many features to list per node (``top``,
1..50, default 3) and which XGBoost contributions to compute (``contributions``: ``approx``, the path
attribution, default; or ``exact``, TreeSHAP, much slower). The answer is
:func:`app.scheduler.explain.explain`'s JSON.

>>> explain_options(b'{"Pod": {}, "Explain": {"top": 5, "contributions": "exact"}}')
(5, 'exact')
>>> explain_options(b'{"Pod": {}}')
(3, 'approx')
>>> explain_options(b'{"Pod": {}, "Explain": {"top": 0}}')
Traceback (most recent call last):
...
app.extender.protocol.ProtocolError: Explain.top: Expected `int` >= 1
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from app.extender.protocol import _decode

DEFAULT_TOP = 3
MAX_TOP = 50


class _Options(msgspec.Struct, forbid_unknown_fields=True):
    top: Annotated[int, msgspec.Meta(ge=1, le=MAX_TOP)] = DEFAULT_TOP
    contributions: Literal["approx", "exact"] = "approx"


class _Body(msgspec.Struct):
    Explain: _Options | None = None


_DECODE = msgspec.json.Decoder(_Body)


def explain_options(body: bytes | bytearray | memoryview) -> tuple[int, str]:
    """(top, contributions method) from the body's ``Explain`` object; :class:`ProtocolError` when invalid."""
    opts = _decode(_DECODE, body, "").Explain or _Options()
    return opts.top, opts.contributions
