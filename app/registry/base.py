"""What the model registry stores and promises: :class:`ModelRecord` and the :class:`ModelStore` seam.

A store keeps, per model key, numbered versions (1, 2, 3, ... never reused) of an XGBoost blob with its
metadata, and a *current* pointer. ``save`` registers a challenger without making it current;
``promote`` (or ``rollback``) moves the pointer — the champion/challenger decision belongs to the
caller. Only the newest ``keep`` versions are kept, plus the current one whatever its age.

Promotion is compare-and-set: a caller that decided against the version current at the time passes it as
``replacing`` (0: there was none), and the pointer moves only if that version is still current, atomically with
the check, else :class:`~app.model.errors.CurrentChangedError` and nothing changed (:func:`check_current`).
``save(..., replacing=v)`` saves and promotes in that one step, so a refused challenger leaves no version behind.

>>> versions_to_drop([1, 2, 3, 4, 5, 6], current=2, keep=3)
[1, 3]
>>> check_model_key("gCTF:gpu:worker-3")
'gCTF:gpu:worker-3'
>>> check_model_key("../etc")
Traceback (most recent call last):
...
app.model.errors.RegistryError: model key '../etc' must match ^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,252}$
>>> check_current("gCTF:gpu", 7, 7), check_current("gCTF:gpu", None, 8), check_current("gCTF:gpu", 0, None)
(7, 8, None)
>>> check_current("gCTF:gpu", 7, 8)
Traceback (most recent call last):
...
app.model.errors.CurrentChangedError: model 'gCTF:gpu': the current version is v8, not v7: nothing changed
>>> check_model_key("gCTF:gpu\\n")
Traceback (most recent call last):
...
app.model.errors.RegistryError: model key 'gCTF:gpu\\n' must match ^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,252}$

Every app the topic contracts accept (a Kubernetes label value) gives keys it accepts, ``app:cpu`` and ``app:gpu``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.model.errors import CurrentChangedError, IntegrityError, ModelNotFoundError, RegistryError

FORMATS = ("ubj", "json")
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,252}$")


def check_model_key(model_key: str) -> str:
    """The key itself if it is safe as a Redis key part and a directory name, else :class:`RegistryError`."""
    if not isinstance(model_key, str) or not _KEY.fullmatch(model_key):
        raise RegistryError(f"model key {model_key!r} must match {_KEY.pattern}")
    return model_key


def check_keep(keep: int) -> int:
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep: must be an integer >= 1 (got {keep!r})")
    return keep


def sha256_hex(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def verify(model_key: str, version: int, blob: bytes, expected: str) -> bytes:
    """``blob`` if its sha256 is ``expected``, else :class:`IntegrityError`."""
    actual = sha256_hex(blob)
    if actual != expected:
        raise IntegrityError(model_key, version, expected, actual)
    return blob


def check_current(model_key: str, replacing: int | None, found: int | None) -> int | None:
    """``found`` (the key's current version, None: none) if a promotion ``replacing`` that version may go ahead:
    ``replacing`` is None (no condition) or names it (0: none); else :class:`CurrentChangedError`."""
    if replacing is not None and replacing != (found or 0):
        raise CurrentChangedError(model_key, replacing, found)
    return found


def versions_to_drop(versions: Sequence[int], current: int | None, keep: int) -> list[int]:
    """Versions beyond the newest ``keep``, except ``current``, in ascending order."""
    ordered = sorted(versions)
    return [v for v in ordered[: max(0, len(ordered) - keep)] if v != current]


def _plain(value: Any) -> Any:
    """JSON-able copy: numpy scalars to Python numbers, tuples to lists."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """Metadata of one stored model version.

    ``metrics`` keeps only finite values (it travels on model-updates, whose contract has no NaN);
    ``training_window`` is ``(first_ts, last_ts)`` of the rows trained on, in unix seconds, if known;
    ``location`` names where the blob lives (a ``redis://...#key`` or a file path); ``restores`` is the version
    whose blob this one saves again when an operator rolled back to it (``rttsched models rollback``), None for
    a trained model (it stays with the registry: model-updates does not carry it).
    """

    model_key: str
    version: int
    sha256: str
    format: str
    features: tuple[str, ...]
    params: dict[str, Any]
    metrics: dict[str, float]
    n_samples: int
    training_window: tuple[float, float] | None
    created_ts: float
    location: str
    restores: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["features"] = list(self.features)
        out["params"] = _plain(self.params)
        out["training_window"] = list(self.training_window) if self.training_window else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelRecord:
        window = data.get("training_window")
        return cls(
            model_key=str(data["model_key"]),
            version=int(data["version"]),
            sha256=str(data["sha256"]),
            format=str(data["format"]),
            features=tuple(str(f) for f in data["features"]),
            params=dict(data.get("params") or {}),
            metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()},
            n_samples=int(data.get("n_samples", 0)),
            training_window=(float(window[0]), float(window[1])) if window else None,
            created_ts=float(data["created_ts"]),
            location=str(data["location"]),
            restores=int(data["restores"]) if data.get("restores") is not None else None,
        )

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModelRecord:
        return cls.from_dict(json.loads(raw))


def new_record(
    model_key: str, version: int, blob: bytes, *, fmt: str, features: Sequence[str], params: Mapping[str, Any],
    metrics: Mapping[str, float], n_samples: int, training_window: tuple[float, float] | None,
    created_ts: float, location: str, restores: int | None = None,
) -> ModelRecord:
    """A validated record of a blob about to be stored (shared by every store)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: must be one of {FORMATS} (got {fmt!r})")
    if not blob:
        raise ValueError("blob: must not be empty")
    clean = {str(k): float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    return ModelRecord(
        model_key=model_key, version=version, sha256=sha256_hex(blob), format=fmt,
        features=tuple(features), params=_plain(dict(params)), metrics=clean, n_samples=int(n_samples),
        training_window=(float(training_window[0]), float(training_window[1])) if training_window else None,
        created_ts=float(created_ts), location=location, restores=restores,
    )


class ModelStore(Protocol):
    """Versioned model blobs with sha256 and a current pointer per model key.

    ``save`` assigns the next version (above ``after`` too: the newest version announced, which a registry
    that lost its data no longer knows) and does **not** make it current; ``promote`` does (``restores``: the
    version whose blob is saved again, :attr:`ModelRecord.restores`). ``replacing`` (of ``save`` and
    ``promote``): make the version current only if the current one is still ``replacing`` (0: none), in the
    same atomic step as that check, else :class:`~app.model.errors.CurrentChangedError` with nothing changed —
    for ``save``, nothing stored (a Redis store's version number is spent: versions may have gaps).
    ``load`` with ``version=None`` loads the current version and verifies its sha256 (:class:`IntegrityError`).
    An unknown key or version raises :class:`~app.model.errors.ModelNotFoundError`.
    """

    def save(
        self, model_key: str, blob: bytes, *, fmt: str, features: Sequence[str], params: Mapping[str, Any],
        metrics: Mapping[str, float], n_samples: int, training_window: tuple[float, float] | None = None,
        after: int = 0, restores: int | None = None, replacing: int | None = None,
    ) -> ModelRecord: ...

    def load(self, model_key: str, version: int | None = None) -> tuple[bytes, ModelRecord]: ...

    def current(self, model_key: str) -> ModelRecord | None: ...

    def versions(self, model_key: str) -> list[ModelRecord]: ...

    def rollback(self, model_key: str, to_version: int | None = None) -> ModelRecord: ...

    def promote(self, model_key: str, version: int, replacing: int | None = None) -> ModelRecord: ...

    def keys(self) -> list[str]: ...


def previous_version(model_key: str, kept: Sequence[int], current: int | None) -> int:
    """The newest kept version older than ``current`` (what ``rollback()`` goes back to)."""
    if current is None:
        raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no current version to roll back from")
    older = [v for v in kept if v < current]
    if not older:
        raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no version older than {current}")
    return max(older)
