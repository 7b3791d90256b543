"""Placement policies, one file each, all behind :class:`app.sim.policy.Policy`.

:func:`make_policy` builds one by name with its own seeded generator; :data:`POLICY_NAMES` lists them
in report order (baselines first, then rtt_aware, the clairvoyant reference last).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.sim.policies.base import BasePolicy
from app.sim.policies.clairvoyant import Clairvoyant
from app.sim.policies.kube_default import KubeDefault
from app.sim.policies.load_aware import LoadAware, load_aware_tuned
from app.sim.policies.simple import RandomChoice, RoundRobin
from app.sim.policies.static_best import StaticBest
from app.sim.policies.target_load import TargetLoad, target_load_tuned
from app.sim.policy import Policy, PolicyError, PolicyTrace

PolicyFactory = Callable[[np.random.Generator], Policy]


def _rtt_aware(rng: np.random.Generator) -> Policy:
    from app.sim.policies.rtt_aware import RttAware  # heavy: xgboost, model and drift code

    return RttAware(rng)


FACTORIES: dict[str, PolicyFactory] = {
    "kube_default": KubeDefault,
    "round_robin": lambda rng: RoundRobin(),
    "random": RandomChoice,
    "load_aware": LoadAware,
    "target_load": TargetLoad,
    "load_aware_tuned": load_aware_tuned,  # the two above at a scaled timing, knobs from a held-out grid
    "target_load_tuned": target_load_tuned,
    "static_best": StaticBest,
    "rtt_aware": _rtt_aware,
    "clairvoyant": lambda rng: Clairvoyant(),
}
POLICY_NAMES = tuple(FACTORIES)
REFERENCE = "clairvoyant"  # not a baseline: it reads the simulator's ground truth
BASELINES = tuple(p for p in POLICY_NAMES if p not in ("rtt_aware", REFERENCE))


def make_policy(name: str, rng: np.random.Generator) -> Policy:
    try:
        factory = FACTORIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}") from None
    return factory(rng)


def parse_policies(spec: str) -> list[str]:
    """``"all"`` or a comma-separated list of policy names, validated.

    >>> parse_policies("clairvoyant,random")
    ['clairvoyant', 'random']
    >>> parse_policies(" , ")
    Traceback (most recent call last):
    ...
    app.sim.policy.PolicyError: no policy named (got ' , '); 'all' or a comma-separated list of: kube_default, ...
    >>> parse_policies("random,clairvoyant,random")
    Traceback (most recent call last):
    ...
    app.sim.policy.PolicyError: 'random' is named twice (each policy runs once per seed)
    """
    if spec.strip() == "all":
        return list(POLICY_NAMES)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:  # a run of nothing would end at once with an empty report and status 0
        raise PolicyError(f"no policy named (got {spec!r}); 'all' or a comma-separated list of: "
                          f"{', '.join(POLICY_NAMES)}")
    for i, n in enumerate(names):
        if n not in FACTORIES:
            raise PolicyError(f"unknown policy {n!r}; known: {', '.join(POLICY_NAMES)}")
        if n in names[:i]:  # its runs would be counted as more seeds of one row, with an interval of 0
            raise PolicyError(f"{n!r} is named twice (each policy runs once per seed)")
    return names


__all__ = ["BASELINES", "POLICY_NAMES", "REFERENCE", "BasePolicy", "Policy", "PolicyError", "PolicyTrace",
           "make_policy", "parse_policies"]
