"""Scheduling policy: per-app SLAs, interfering app pairs, and how just-placed pods count.

Read from a YAML or JSON file (``RTT_EXTENDER_POLICY_FILE``); every field is optional::

    sla_ms: {gCTF: 8000, Motioncor2: 30000}      # a node whose predicted RTT exceeds it fails the filter
    anti_affinity:                               # apps that must not share a node
      - [Motioncor2, Motioncor2]                 # e.g. two Motioncor2 on one GPU
      - [Motioncor2, gCTF]
    contention: {interfering: 0.5, other: 0.3}   # RTT inflation per assumed pod (fraction)
    assumed: {ttl_s: 120, scrape_delay_s: 1}     # how long a placed pod counts before metrics show it
    sla_when_all_fail: pass                      # pass | fail: when SLA would reject every candidate
    exploration: {share: 0.25, min_samples: 0}   # app/scheduler/explore.py (share 0: off)
    objective: {inflicted: 1.0}                  # app/scheduler/inflict.py: weight of the slowdown a pod
                                                 # adds to the pods running beside it (0: own RTT only)

Bad values raise :class:`~app.errors.ConfigError` naming the field path.

>>> p = policy_from_dict({"anti_affinity": [["Motioncor2", "Motioncor2"]], "sla_ms": {"gCTF": 800}})
>>> p.interferes("Motioncor2", "Motioncor2"), p.interferes("gCTF", "Motioncor2")
(True, False)
>>> policy_from_dict({"sla_ms": {"gCTF": -1}})
Traceback (most recent call last):
...
app.errors.ConfigError: policy.sla_ms.gCTF: must be a number > 0 (got -1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from app.errors import ConfigError, read_error

SLA_WHEN_ALL_FAIL = ("pass", "fail")
_TOP_LEVEL = {"sla_ms", "anti_affinity", "contention", "assumed", "sla_when_all_fail", "exploration", "objective"}
_NESTED = {"contention": {"interfering", "other"}, "assumed": {"ttl_s", "scrape_delay_s"},
           "exploration": {"share", "min_samples"}, "objective": {"inflicted"}}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Immutable policy; ``Policy()`` is the default (no SLA, no anti-affinity)."""

    sla_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    anti_affinity: frozenset[frozenset[str]] = frozenset()
    contention_interfering: float = 0.5  # RTT x (1 + this) per assumed pod of an interfering app
    contention_other: float = 0.3  # RTT x (1 + this) per assumed pod of any other app
    assumed_ttl_s: float = 120.0  # an assumed placement is forgotten after this long
    scrape_delay_s: float = 1.0  # node-features newer than placement + this already show the pod (a scrape interval)
    sla_when_all_fail: str = "pass"
    explore_share: float = 0.25  # fraction of an app's pods that may go to a node not yet learnt (0: never)
    explore_min_samples: int = 0  # a node with fewer completed tasks of the app is not yet learnt (0: only
    # nodes no model covers are; app/scheduler/explore.py says what more costs)
    inflicted_weight: float = 1.0  # cost = own RTT + this x the time added to the pods running there

    def interferes(self, app_a: str, app_b: str) -> bool:
        """Whether two apps must not share a node (symmetric)."""
        return frozenset((app_a, app_b)) in self.anti_affinity

    def sla(self, app: str) -> float | None:
        return self.sla_ms.get(app)


def _number(value: Any, path: str, *, minimum: float = 0.0, strict: bool = True) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)
    if ok and (value > minimum if strict else value >= minimum):
        return float(value)
    op = ">" if strict else ">="
    raise ConfigError(path, f"must be a number {op} {minimum:g} (got {value!r})")


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int with hundreds of digits
        return False


def _mapping(value: Any, path: str, known: set[str] | None = None) -> Mapping[str, Any]:
    """``value`` as a mapping (None: an empty one); with ``known``, a key not in it is an error naming its path."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be a mapping (got {type(value).__name__})")
    if known is not None:
        for key in value:
            if key not in known:
                name = key if isinstance(key, str) else repr(key)
                raise ConfigError(f"{path}.{name}", f"unknown field (known: {', '.join(sorted(known))})")
    return value


def _app(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"must be a non-empty app name (got {value!r})")
    return value


def _pairs(value: Any, path: str) -> frozenset[frozenset[str]]:
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise ConfigError(path, f"must be a list of [app, app] pairs (got {type(value).__name__})")
    out = set()
    for i, pair in enumerate(value):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ConfigError(f"{path}[{i}]", f"must be a pair [app, app] (got {pair!r})")
        out.add(frozenset((_app(pair[0], f"{path}[{i}][0]"), _app(pair[1], f"{path}[{i}][1]"))))
    return frozenset(out)


def policy_from_dict(doc: Any, source: str = "policy") -> Policy:
    """Validate a parsed policy document; ``source`` prefixes field paths in errors."""
    doc = _mapping(doc, source, _TOP_LEVEL)
    sla = {_app(k, f"{source}.sla_ms"): _number(v, f"{source}.sla_ms.{k}")
           for k, v in _mapping(doc.get("sla_ms"), f"{source}.sla_ms").items()}
    contention = _mapping(doc.get("contention"), f"{source}.contention", _NESTED["contention"])
    assumed = _mapping(doc.get("assumed"), f"{source}.assumed", _NESTED["assumed"])
    defaults = Policy()
    explore = _mapping(doc.get("exploration"), f"{source}.exploration", _NESTED["exploration"])
    share = _number(explore.get("share", defaults.explore_share), f"{source}.exploration.share", strict=False)
    if share > 1.0:
        raise ConfigError(f"{source}.exploration.share", f"must be a number between 0 and 1 (got {share!r})")
    min_samples = explore.get("min_samples", defaults.explore_min_samples)
    if not isinstance(min_samples, int) or isinstance(min_samples, bool) or min_samples < 0:
        raise ConfigError(f"{source}.exploration.min_samples", f"must be an integer >= 0 (got {min_samples!r})")
    objective = _mapping(doc.get("objective"), f"{source}.objective", _NESTED["objective"])
    inflicted = _number(objective.get("inflicted", defaults.inflicted_weight), f"{source}.objective.inflicted",
                        strict=False)
    mode = doc.get("sla_when_all_fail", defaults.sla_when_all_fail)
    if mode not in SLA_WHEN_ALL_FAIL:
        raise ConfigError(f"{source}.sla_when_all_fail", f"must be one of {SLA_WHEN_ALL_FAIL} (got {mode!r})")
    return Policy(
        sla_ms=MappingProxyType(sla),
        anti_affinity=_pairs(doc.get("anti_affinity"), f"{source}.anti_affinity"),
        contention_interfering=_number(contention.get("interfering", defaults.contention_interfering),
                                       f"{source}.contention.interfering", strict=False),
        contention_other=_number(contention.get("other", defaults.contention_other),
                                 f"{source}.contention.other", strict=False),
        assumed_ttl_s=_number(assumed.get("ttl_s", defaults.assumed_ttl_s), f"{source}.assumed.ttl_s"),
        scrape_delay_s=_number(assumed.get("scrape_delay_s", defaults.scrape_delay_s),
                               f"{source}.assumed.scrape_delay_s", strict=False),
        sla_when_all_fail=mode, explore_share=share, explore_min_samples=min_samples, inflicted_weight=inflicted,
    )


def load_policy(path: str | Path | None) -> Policy:
    """The policy in a YAML/JSON file; the default policy when ``path`` is empty."""
    if not path:
        return Policy()
    return policy_from_dict(load_policy_document(path), source=str(path))


def load_policy_document(path: str | Path) -> Any:
    """The document of a YAML/JSON policy file, as read (:func:`policy_from_dict` checks it)."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("RTT_EXTENDER_POLICY_FILE", f"cannot read {path}: {read_error(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("RTT_EXTENDER_POLICY_FILE", f"{path} is not valid YAML/JSON: {read_error(exc)}") from None
