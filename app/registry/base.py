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

A stored record that cannot be read (metadata that is not JSON or lacks a field, a current pointer that is not a
number, a Redis key of the wrong type) is a :class:`CorruptRecordError`, a
:class:`~app.model.errors.RegistryError` naming the key, the version and what is wrong; nothing is changed:

>>> ModelRecord.from_json(b'{"model_key": "gCTF:gpu", "version": "two"}')
Traceback (most recent call last):
...
ValueError: metadata lacks 'sha256', 'format', 'features', 'created_ts', 'location'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
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
    def from_dict(cls, data: Any) -> ModelRecord:
        """The record ``data`` (a parsed ``to_dict``) holds; ValueError saying what is wrong with it, in one line:
        not an object, fields missing, or a field of the wrong kind."""
        if not isinstance(data, Mapping):
            raise ValueError(f"metadata is a JSON {_json_kind(data)}, not an object")
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise ValueError(f"metadata lacks {', '.join(map(repr, missing))}")
        fields: dict[str, Any] = {}
        for name, read in _FIELDS.items():
            try:
                fields[name] = read(data)
            except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
                raise ValueError(f"metadata field {name!r} is unusable ({type(exc).__name__}: {exc})") from None
        return cls(**fields)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModelRecord:
        """The record ``raw`` holds; ValueError saying what is wrong with it in one line (:meth:`from_dict`)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
            raise ValueError(f"metadata is not JSON ({exc})") from None
        return cls.from_dict(data)


def _window(data: Mapping[str, Any]) -> tuple[float, float] | None:
    window = data.get("training_window")
    return (float(window[0]), float(window[1])) if window else None


_REQUIRED = ("model_key", "version", "sha256", "format", "features", "created_ts", "location")
_FIELDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "model_key": lambda d: str(d["model_key"]),
    "version": lambda d: int(d["version"]),
    "sha256": lambda d: str(d["sha256"]),
    "format": lambda d: str(d["format"]),
    "features": lambda d: tuple(str(f) for f in d["features"]),
    "params": lambda d: dict(d.get("params") or {}),
    "metrics": lambda d: {str(k): float(v) for k, v in (d.get("metrics") or {}).items()},
    "n_samples": lambda d: int(d.get("n_samples", 0)),
    "training_window": _window,
    "created_ts": lambda d: float(d["created_ts"]),
    "location": lambda d: str(d["location"]),
    "restores": lambda d: int(d["restores"]) if d.get("restores") is not None else None,
}


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's kind.

    >>> _json_kind([1]), _json_kind("x"), _json_kind(None), _json_kind(True), _json_kind(2.5)
    ('array', 'string', 'null', 'boolean', 'number')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "array"


class CorruptRecordError(RegistryError):
    """A record the registry holds cannot be read: metadata that is not JSON or lacks a field, a current pointer
    that is not a version number, a Redis key holding the wrong kind of value. ``model_key`` and ``version``
    (None: not one version's, e.g. the current pointer) name it, ``problem`` says what is wrong, ``where`` is the
    Redis key or the file. Nothing is changed: it stays for an operator to repair or remove.

    >>> str(CorruptRecordError("gCTF:gpu", 2, "metadata is not JSON", "rttsched:model:gCTF:gpu:meta:2"))
    "model 'gCTF:gpu' version 2: metadata is not JSON (rttsched:model:gCTF:gpu:meta:2)"
    >>> str(CorruptRecordError("gCTF:gpu", None, "its current version 'x' is not a version number"))
    "model 'gCTF:gpu': its current version 'x' is not a version number"
    """

    def __init__(self, model_key: str, version: int | None, problem: str, where: str = "") -> None:
        self.model_key = model_key
        self.version = version
        self.problem = problem
        self.where = where
        what = f"model {model_key!r}" + (f" version {version}" if version is not None else "")
        super().__init__(f"{what}: {problem}" + (f" ({where})" if where else ""))


class BlobError(RegistryError):
    """A version whose record reads but whose blob cannot serve: gone (a Redis key evicted or deleted, a file
    removed), holding another kind of value, or bytes whose sha256 is not the record's. ``model_key`` and
    ``version`` name it, ``problem`` says what is wrong, ``where`` is the blob's Redis key or file. No process can
    load that version; nothing is changed.

    >>> str(BlobError("gCTF:gpu", 2, "its blob is missing", "rttsched:model:gCTF:gpu:blob:2"))
    "model 'gCTF:gpu' version 2: its blob is missing (rttsched:model:gCTF:gpu:blob:2)"
    """

    def __init__(self, model_key: str, version: int, problem: str, where: str = "") -> None:
        self.model_key = model_key
        self.version = version
        self.problem = problem
        self.where = where
        super().__init__(f"model {model_key!r} version {version}: {problem}" + (f" ({where})" if where else ""))


MISSING_BLOB = "its blob is missing: no process can load this version"


def blob_mismatch(blob: bytes, record: ModelRecord) -> str | None:
    """What is wrong with ``blob`` as ``record``'s blob (its sha256 is not the recorded one), None where nothing.

    >>> r = new_record("k", 1, b"blob", fmt="json", features=[], params={}, metrics={}, n_samples=1,
    ...                training_window=None, created_ts=0.0, location="")
    >>> blob_mismatch(b"blob", r) is None, blob_mismatch(b"blob!", r)
    (True, 'its blob has sha256 fade95397337..., not the recorded fa2c8cc4f281...: changed or truncated')
    """
    actual = sha256_hex(blob)
    if actual == record.sha256:
        return None
    return f"its blob has sha256 {actual[:12]}..., not the recorded {record.sha256[:12]}...: changed or truncated"


def read_record(raw: bytes | str, model_key: str, version: int, where: str = "") -> ModelRecord:
    """The record stored as ``model_key``'s ``version`` (at ``where``), else :class:`CorruptRecordError` naming them
    and what is wrong.

    >>> read_record(b"not json{", "gCTF:gpu", 2)
    Traceback (most recent call last):
    ...
    app.registry.base.CorruptRecordError: model 'gCTF:gpu' version 2: metadata is not JSON
    (Expecting value: line 1 column 1 (char 0))
    >>> read_record(b'{"model_key": "gCTF:gpu"}', "gCTF:gpu", 2)
    Traceback (most recent call last):
    ...
    app.registry.base.CorruptRecordError: model 'gCTF:gpu' version 2: metadata lacks 'version', 'sha256', 'format',
    'features', 'created_ts', 'location'
    """
    try:
        return ModelRecord.from_json(raw)
    except ValueError as exc:
        raise CorruptRecordError(model_key, version, str(exc), where) from None


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
    An unknown key or version raises :class:`~app.model.errors.ModelNotFoundError`. A record that cannot be read
    (metadata that is not a record, a current pointer that is not a version number) raises
    :class:`CorruptRecordError` from whatever reads it, and only from that: ``load`` of one version reads that
    version's record and the current pointer (for the current version), ``current`` the pointer and its record,
    ``versions`` every kept record — :meth:`readable_versions` returns the readable ones and an error per other.
    """

    def save(
        self, model_key: str, blob: bytes, *, fmt: str, features: Sequence[str], params: Mapping[str, Any],
        metrics: Mapping[str, float], n_samples: int, training_window: tuple[float, float] | None = None,
        after: int = 0, restores: int | None = None, replacing: int | None = None,
    ) -> ModelRecord: ...

    def load(self, model_key: str, version: int | None = None) -> tuple[bytes, ModelRecord]: ...

    def current(self, model_key: str) -> ModelRecord | None: ...

    def versions(self, model_key: str) -> list[ModelRecord]: ...

    def readable_versions(self, model_key: str) -> tuple[list[ModelRecord], list[CorruptRecordError]]: ...

    def rollback(self, model_key: str, to_version: int | None = None) -> ModelRecord: ...

    def promote(self, model_key: str, version: int, replacing: int | None = None) -> ModelRecord: ...

    def keys(self) -> list[str]: ...

    def blob_stored(self, record: ModelRecord) -> bool:
        """Whether ``record``'s blob is where the store keeps it, by a cheap look (no read of the blob)."""
        ...

    def check_blobs(self, model_key: str, records: Sequence[ModelRecord], read: bool = False) -> list[BlobError]:
        """A :class:`BlobError` per record of ``records`` (``model_key``'s) whose blob is missing while its metadata
        stays (a version trimmed meanwhile is no error) or holds another kind of value, by a cheap look (Redis
        ``TYPE``, a file's ``stat``: no blob is read); with ``read``, each blob is read and its sha256 checked against
        the record's too (one blob in memory at a time)."""
        ...


def previous_version(model_key: str, kept: Sequence[int], current: int | None) -> int:
    """The newest kept version older than ``current`` (what ``rollback()`` goes back to)."""
    if current is None:
        raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no current version to roll back from")
    older = [v for v in kept if v < current]
    if not older:
        raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no version older than {current}")
    return max(older)
