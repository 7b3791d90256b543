"""argparse types the benchmarks share: a count or size that cannot be is argparse's usage error (exit 2) at
start, not a traceback minutes into a run.

>>> positive_int("3"), positive_float("0.5")
(3, 0.5)
>>> positive_int("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be an integer >= 1 (got '0')
"""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text!r})")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {text!r})")
    return value
