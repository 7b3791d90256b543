"""The rule a feature name follows, and how many names one message may carry, as the contracts say them.

A feature name reaches XGBoost, which refuses ``[``, ``]`` and ``<`` in one (``<metric>__<aggregate>``,
``running_pods_<app>``, ``hw_*``, ``task_*``): training-samples' ``features`` names follow a pattern that keeps to
letters, digits, ``_``, ``.``, ``:`` and ``-`` (a letter or ``_`` first), and so do the names that become feature names
(node-metrics' metric names, rtt-predictions' task features). The counts are bounded well above what this
project's producers write. The trainer checks the names a sample would add to its key's history here too, for a
sample decoded by an older contract (:mod:`app.trainer.history`), and training checks the names it is given.

>>> feature_name_ok("cpu_iowait__mean"), feature_name_ok("running_pods_my-app.v2"), feature_name_ok("gpu_util[0]")
(True, True, False)
>>> feature_name_ok("cpu_iowait\\n"), feature_name_ok(""), feature_name_ok("x" * 201)
(False, False, False)
>>> bad_feature_name(["hw_gpu_count", "a<b", "c d"])
'a<b'
>>> FEATURE_NAMES_MAX, METRIC_NAMES_MAX
(1600, 512)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from app.contracts.loader import contract

XGBOOST_REFUSED = ("[", "]", "<")  # characters XGBoost refuses in a feature name


def _names_rule(topic: str, field: str) -> tuple[dict[str, Any], int | None]:
    schema = contract(topic).value_schema["properties"][field]
    return schema["propertyNames"], schema.get("maxProperties")


def _searched(pattern: str) -> re.Pattern[str]:
    """A contract's pattern as its validator matches it: searched, ``$`` the end of the string (not before a final
    newline)."""
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


_RULE, _MAX = _names_rule("training-samples", "features")
FEATURE_NAME = _searched(_RULE["pattern"])
FEATURE_NAME_MAX_LENGTH = int(_RULE["maxLength"])
FEATURE_NAMES_MAX = int(_MAX) if _MAX is not None else 0  # names one training sample carries at most
_METRIC_RULE, _METRICS_MAX = _names_rule("node-metrics", "metrics")
METRIC_NAME = _searched(_METRIC_RULE["pattern"])
METRIC_NAME_MAX_LENGTH = int(_METRIC_RULE["maxLength"])  # room for ``__<aggregate>`` in a feature name
METRIC_NAMES_MAX = int(_METRICS_MAX or 0)  # metric names one scrape carries at most


def feature_name_ok(name: object) -> bool:
    """Whether ``name`` is a feature name the training-samples contract (and XGBoost) takes."""
    return isinstance(name, str) and 0 < len(name) <= FEATURE_NAME_MAX_LENGTH and FEATURE_NAME.search(name) is not None


def metric_name_ok(name: object) -> bool:
    """Whether ``name`` is a metric name the node-metrics contract takes (so its feature names are ones too).

    >>> metric_name_ok("gpu_util"), metric_name_ok("gpu_util[0]"), metric_name_ok("x" * 195)
    (True, False, False)
    """
    return isinstance(name, str) and 0 < len(name) <= METRIC_NAME_MAX_LENGTH and METRIC_NAME.search(name) is not None


def bad_feature_name(names: Iterable[object]) -> object | None:
    """The first of ``names`` that is no feature name (:func:`feature_name_ok`), or None."""
    return next((n for n in names if not feature_name_ok(n)), None)


def xgboost_refuses(name: object) -> bool:
    """Whether XGBoost refuses ``name`` as a feature name (not a string, or one with ``[``, ``]`` or ``<``); every
    name :func:`feature_name_ok` takes, it takes.

    >>> xgboost_refuses("gpu_util[0]"), xgboost_refuses("a<b"), xgboost_refuses("cpu iowait"), xgboost_refuses(3)
    (True, True, False, True)
    """
    return not isinstance(name, str) or any(c in name for c in XGBOOST_REFUSED)
