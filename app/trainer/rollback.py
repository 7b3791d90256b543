"""An operator's rollback of a model key, the way the running system applies it.

Moving the registry's current pointer back would reach no process: the workers and extenders learn models from
model-updates and ignore a version older than the one they hold, and the trainer's registry check would take a
current below the newest announced for a registry that lost its data. So a rollback saves the verified blob of
the version gone back to again, as a new version above both the registry's newest and the newest announced
(:meth:`~app.trainer.registry.ModelRegistry.restore`; the record's ``restores`` names the version), makes it
current, and announces it with the trainer's message (:func:`app.trainer.announcements.announce`). It is saved
and made current in one compare-and-set step, in place of the current version the plan was made against only: a
retrain promoted meanwhile is left current and nothing is saved (:func:`roll_back`).

The version gone back to by default is the one before the model the current one serves — the version it restores,
when it is a rollback itself, so that a second rollback goes further back instead of undoing the first — with a
blob other than the current one's. "Before" is along the versions the key served, in the order they were given:
each kept version stands at its own place, and a kept rollback copy also stands, with its model, at the place of
the version it restores when that version was trimmed (``keep``) — so a rollback goes back to a model that is kept
only as a copy, and never to a copy of the current model (:func:`default_target`). Where nothing was trimmed, that
is :func:`~app.registry.base.previous_version` of the model served among the kept versions with another blob.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from app.model.errors import CurrentChangedError, ModelNotFoundError, RegistryError
from app.registry.base import CorruptRecordError, ModelRecord, ModelStore, check_model_key, previous_version
from app.trainer.registry import ModelRegistry


@dataclasses.dataclass(frozen=True)
class RollbackPlan:
    """What a rollback of ``model_key`` will do: ``current`` replaced by the model of ``target``, saved again
    above ``announced`` (the newest version announced for the key; 0: none)."""

    model_key: str
    current: ModelRecord
    target: ModelRecord
    announced: int


def served(record: ModelRecord) -> int:
    """The version whose model ``record`` is: the one it restores, else its own."""
    return record.restores or record.version


def default_target(model_key: str, kept: Sequence[ModelRecord], current: ModelRecord) -> int:
    """The version a rollback without ``--to`` goes back to (see the module docstring and :func:`lineage`).

    >>> def rec(v, sha, restores=None):
    ...     return ModelRecord("k:cpu", v, sha, "ubj", (), {}, {}, 1, None, 0.0, "", restores)
    >>> v1, v2, v3 = rec(1, "a"), rec(2, "b"), rec(3, "c")
    >>> default_target("k:cpu", [v1, v2, v3], v3)
    2
    >>> v4 = rec(4, "b", restores=2)  # v3 was rolled back to v2's model
    >>> default_target("k:cpu", [v1, v2, v3, v4], v4)
    1

    v1 and v2 trimmed after rollbacks to v1 (v3) and back to v2 (v4): v3 holds the model served before v2's.

    >>> default_target("k:cpu", [rec(3, "a", restores=1), rec(4, "b", restores=2)], rec(4, "b", restores=2))
    3
    """
    return _previous(model_key, kept, current)[1]


def lineage(kept: Sequence[ModelRecord]) -> dict[int, ModelRecord]:
    """The places in the key's history that ``kept`` records tell, each with a kept record holding its model: every
    kept version at its own place, and the version a kept rollback copy restores, when that one is not kept, held by
    its newest copy.

    >>> def rec(v, sha, restores=None):
    ...     return ModelRecord("k:cpu", v, sha, "ubj", (), {}, {}, 1, None, 0.0, "", restores)
    >>> {place: r.version for place, r in lineage([rec(3, "a", 1), rec(4, "b", 2), rec(5, "a", 1)]).items()}
    {3: 3, 4: 4, 5: 5, 1: 5, 2: 4}
    """
    places: dict[int, ModelRecord] = {r.version: r for r in kept}
    versions = set(places)
    for r in sorted(kept, key=lambda r: r.version):
        if r.restores is not None and r.restores not in versions:
            places[r.restores] = r
    return places


def _previous(model_key: str, kept: Sequence[ModelRecord], current: ModelRecord) -> tuple[int, int]:
    """The place before the model ``current`` serves along :func:`lineage` (with another blob than the current
    one's), and the kept version holding its model; :class:`ModelNotFoundError` when there is none."""
    places = lineage(kept)
    different = [place for place, r in places.items() if r.sha256 != current.sha256]
    place = previous_version(model_key, different, served(current))
    return place, places[place].version


def plan_rollback(store: ModelStore, model_key: str, to_version: int | None = None,
                  announced: int = 0) -> RollbackPlan:
    """The rollback of ``model_key`` to ``to_version`` (default: :func:`default_target`); :class:`RegistryError`
    (:class:`ModelNotFoundError` for an unknown key or version) when there is nothing to roll back to.

    A record it needs that cannot be read raises its :class:`~app.registry.base.CorruptRecordError`: the current
    one, the one asked for, or, without ``to_version``, one that might hold the model the default target should be
    (:func:`_default_target`; name the version with ``to_version``). Others unreadable are no obstacle."""
    check_model_key(model_key)
    current = store.current(model_key)
    if current is None:
        known = store.keys()
        detail = (f"model {model_key!r} has no current version" if model_key in known else
                  f"no model {model_key!r} in the registry (keys: {listing(known)})")
        raise ModelNotFoundError(model_key, detail=detail)
    kept, unreadable = store.readable_versions(model_key)
    if to_version is None:
        version = _default_target(model_key, kept, current, unreadable)
    else:
        version = to_version
        for exc in unreadable:
            if exc.version == version:
                raise exc
    target = next((r for r in kept if r.version == version), None)
    if target is None:
        listed = ", ".join(f"v{r.version}" for r in kept)
        raise ModelNotFoundError(model_key, version, f"model {model_key!r} has no version {version} (kept: {listed})")
    if target.version == current.version:
        raise RegistryError(f"model {model_key!r}: v{version} is the current version already")
    if target.sha256 == current.sha256:
        raise RegistryError(f"model {model_key!r}: v{version} is the model the current v{current.version} serves "
                            f"already (sha256 {current.sha256[:12]})")
    return RollbackPlan(model_key, current, target, announced)


def listing(keys: Sequence[str], shown: int = 10) -> str:
    """The first ``shown`` of ``keys``, and how many more there are.

    >>> listing([]), listing(["a:cpu", "b:gpu"]), listing([f"k{i}:cpu" for i in range(3001)], shown=2)
    ('none', 'a:cpu, b:gpu', 'k0:cpu, k1:cpu and 2999 more')
    """
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return (", ".join(keys[:shown]) or "none") + more


def _default_target(model_key: str, kept: Sequence[ModelRecord], current: ModelRecord,
                    unreadable: Sequence[CorruptRecordError]) -> int:
    """:func:`default_target` among the readable ``kept`` records, unless an ``unreadable`` one might hold the model
    meant: :class:`RegistryError` naming it. That is one between the place gone back to and the model the current one
    serves (or before it, where there is none), and — where a version between them is not known (trimmed: a
    rollback copy above might hold its model) — one above the model the current one serves."""
    place: int | None = None
    try:
        place, version = _previous(model_key, kept, current)
    except ModelNotFoundError:
        version = 0
    low, high = place or 0, served(current)
    known = {*lineage(kept), *(exc.version for exc in unreadable if exc.version is not None)}
    hidden = sum(1 for v in known if low < v < high) < high - low - 1
    skipped = sorted(exc.version for exc in unreadable
                     if exc.version is not None and exc.version != current.version
                     and (low < exc.version < high or (hidden and exc.version > high)))
    if skipped:
        exc = next(e for e in unreadable if e.version == skipped[-1])
        raise RegistryError(f"{exc}: cannot tell whether a rollback goes back to it; name the version to go back "
                            "to (--to)") from None
    if place is None:
        return default_target(model_key, kept, current)  # raises the reason there is none
    return version


def roll_back(registry: ModelRegistry, plan: RollbackPlan) -> dict[str, Any]:
    """Save the plan's target again above every version given and announced, and make it current in place of the
    plan's current version; its model-updates fields. :class:`RegistryError` when the key's current version is no
    longer the plan's, up to the moment it would be replaced (the trainer promoted one meanwhile): nothing is
    saved, nothing changed; plan again."""
    try:
        return registry.restore(plan.model_key, plan.target.version, max(plan.announced, plan.current.version),
                                replacing=plan.current.version)
    except CurrentChangedError as exc:
        found = f"v{exc.found}" if exc.found else "none"
        raise RegistryError(f"the current version of {plan.model_key} changed to {found} while rolling back: "
                            "nothing changed; run it again") from None
