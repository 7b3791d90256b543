"""The model registry in a local directory, for when no Redis is configured.

Layout: ``<root>/<model key>/<version>.<fmt>`` (the blob, ``ubj`` or ``json``), ``<version>.meta.json``
(its :class:`ModelRecord`)
and ``CURRENT`` (the current version number). Every file is written to a temporary name and renamed
into place, and the blob is in place before its metadata, so a reader — which only looks at versions
that have a ``.meta.json`` — never sees metadata without its blob. Writers of one key serialise on an
``flock`` of ``<root>/<model key>/.lock`` (several processes may share the directory); a promotion ``replacing`` a
version checks ``CURRENT`` under that lock, before it writes anything.

A directory that cannot be written, locked or read — full, read-only, not permitted, replaced by a file, a
disk error — raises :class:`~app.model.errors.RegistryUnavailableError` from every method, naming the directory
and the OS error (``models directory /x: No space left on device``): like Redis away, a condition to wait out,
not a broken model (a missing file is still :class:`~app.model.errors.ModelNotFoundError`). A write that failed
leaves no partial file behind. :meth:`DirectoryModelStore.check_writable` tells when the directory takes a
write of a given size again. A ``<version>.meta.json`` that is not a record raises
:class:`~app.registry.base.CorruptRecordError` naming the file, from whatever reads it (a ``CURRENT`` that is not a
number is no current version).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from app.clock import Clock, SystemClock
from app.model.errors import ModelNotFoundError, RegistryUnavailableError
from app.registry.base import (
    FORMATS,
    MISSING_BLOB,
    BlobError,
    CorruptRecordError,
    ModelRecord,
    blob_mismatch,
    check_current,
    check_keep,
    check_model_key,
    new_record,
    previous_version,
    read_record,
    verify,
    versions_to_drop,
)

log = logging.getLogger(__name__)

CURRENT = "CURRENT"
META = ".meta.json"
F = TypeVar("F", bound=Callable[..., Any])


def directory_error(root: Path, exc: OSError) -> str:
    """Why the models directory ``root`` cannot be used now, for a log line: its path, the OS error, the file.

    >>> import errno
    >>> directory_error(Path("/x"), OSError(errno.ENOSPC, "No space left on device"))
    'models directory /x: No space left on device'
    >>> directory_error(Path("/x"), OSError(errno.EROFS, "Read-only file system", "/x/k/.lock"))
    'models directory /x: Read-only file system (/x/k/.lock)'
    """
    what = exc.strerror or repr(exc)
    return f"models directory {root}: {what}" + (f" ({exc.filename})" if exc.filename else "")


def _available(method: F) -> F:
    """Turn an OSError of the models directory into :class:`RegistryUnavailableError` naming it: callers retry a
    registry that cannot be used now, and tell it from a broken model."""

    @functools.wraps(method)
    def wrapper(self: DirectoryModelStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            raise RegistryUnavailableError(directory_error(self.path, exc)) from exc

    return wrapper  # type: ignore[return-value]


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class DirectoryModelStore:
    """:class:`~app.registry.base.ModelStore` over files under ``path`` (created if missing)."""

    def __init__(self, path: str | os.PathLike[str], keep: int = 5, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.keep = check_keep(keep)
        self._clock = clock or SystemClock()

    @_available
    def check_writable(self, model_key: str, nbytes: int = 1) -> None:
        """Write ``nbytes`` (at least one) to a scratch file of ``model_key``'s directory under its lock, then
        remove it: :class:`RegistryUnavailableError` while the directory cannot take them (full, read-only, not
        permitted, replaced by a file), so a caller can wait for room for a model before training it again."""
        with self._locked(model_key) as d:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".probe.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(bytes(max(1, nbytes)))
                    fh.flush()
                    os.fsync(fh.fileno())
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    # -- layout
    def _dir(self, model_key: str) -> Path:
        return self.path / check_model_key(model_key)

    def _kept(self, model_key: str) -> list[int]:
        d = self._dir(model_key)
        if not d.is_dir():
            return []
        names = (p.name.removesuffix(META) for p in d.glob(f"*{META}"))
        return sorted(int(n) for n in names if n.isdigit())

    def _current_version(self, model_key: str) -> int | None:
        try:
            return int((self._dir(model_key) / CURRENT).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _record(self, model_key: str, version: int) -> ModelRecord:
        path = self._dir(model_key) / f"{version}{META}"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ModelNotFoundError(model_key, version) from None
        return read_record(raw, model_key, version, str(path))

    @contextlib.contextmanager
    def _locked(self, model_key: str) -> Iterator[Path]:
        d = self._dir(model_key)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield d
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _trim(self, model_key: str, d: Path) -> None:
        current = self._current_version(model_key)
        for v in versions_to_drop(self._kept(model_key), current, self.keep):
            (d / f"{v}{META}").unlink(missing_ok=True)  # metadata first: the version disappears at once
            for fmt in FORMATS:
                (d / f"{v}.{fmt}").unlink(missing_ok=True)
            log.debug("model %s: dropped version %d", model_key, v)
        kept = self._kept(model_key)
        for fmt in FORMATS:  # blobs whose metadata is gone (removed by hand), below the versions kept, not current
            for blob in d.glob(f"*.{fmt}"):
                name = blob.name.removesuffix(f".{fmt}")
                if not name.isdigit():
                    continue
                version = int(name)
                if kept and version < max(kept) and version not in kept and version != current:
                    blob.unlink(missing_ok=True)
                    log.debug("model %s: dropped the blob of version %d, which has no metadata", model_key, version)

    # -- ModelStore
    @_available
    def save(
        self, model_key: str, blob: bytes, *, fmt: str, features: Sequence[str], params: Mapping[str, Any],
        metrics: Mapping[str, float], n_samples: int, training_window: tuple[float, float] | None = None,
        after: int = 0, restores: int | None = None, replacing: int | None = None,
    ) -> ModelRecord:
        with self._locked(model_key) as d:
            check_current(model_key, replacing, self._current_version(model_key))
            # above the current version too, whose metadata may be gone: a version number is never used twice
            version = max(max(self._kept(model_key), default=0), self._current_version(model_key) or 0, after) + 1
            blob_path = d / f"{version}.{fmt}"
            record = new_record(
                model_key, version, blob, fmt=fmt, features=features, params=params, metrics=metrics,
                n_samples=n_samples, training_window=training_window, created_ts=self._clock.now(), restores=restores,
                location=str(blob_path.resolve()),
            )
            _atomic_write(blob_path, blob)
            _atomic_write(d / f"{version}{META}", record.to_json())
            if replacing is not None:
                _atomic_write(d / CURRENT, str(version).encode())
            self._trim(model_key, d)
        log.info("model %s: saved version %d (%d bytes)%s", model_key, version, len(blob),
                 ": current" if replacing is not None else "")
        return record

    @_available
    def load(self, model_key: str, version: int | None = None) -> tuple[bytes, ModelRecord]:
        if version is None:
            version = self._current_version(model_key)
            if version is None:
                raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no current version")
        record = self._record(model_key, version)
        try:
            blob = (self._dir(model_key) / f"{version}.{record.format}").read_bytes()
        except FileNotFoundError:
            raise ModelNotFoundError(model_key, version) from None
        return verify(model_key, version, blob, record.sha256), record

    @_available
    def current(self, model_key: str) -> ModelRecord | None:
        version = self._current_version(model_key)
        if version is None:
            return None
        try:
            return self._record(model_key, version)
        except ModelNotFoundError:
            return None

    @_available
    def blob_stored(self, record: ModelRecord) -> bool:
        return (self._dir(record.model_key) / f"{record.version}.{record.format}").is_file()

    @_available
    def check_blobs(self, model_key: str, records: Sequence[ModelRecord], read: bool = False) -> list[BlobError]:
        d, errors = self._dir(model_key), []
        for record in records:
            blob = d / f"{record.version}.{record.format}"
            if record.format not in FORMATS:  # no file to look at: the name would be the record's to choose
                problem: str | None = f"its record names blob format {record.format!r}, not one of {FORMATS}"
            elif read:
                try:
                    problem = blob_mismatch(blob.read_bytes(), record)
                except (FileNotFoundError, IsADirectoryError):
                    problem = MISSING_BLOB
                except OSError as exc:  # this blob's own fault (a bad sector, a link loop): the others are read
                    problem = f"its blob cannot be read: {exc.strerror or type(exc).__name__}"
            else:
                problem = None if blob.is_file() else MISSING_BLOB
            # a trim removes the metadata before the blob: metadata still there after the blob was found gone is a
            # blob lost, not a version trimmed meanwhile
            if problem is not None and (problem != MISSING_BLOB or (d / f"{record.version}{META}").is_file()):
                errors.append(BlobError(model_key, record.version, problem, str(blob)))
        return errors

    @_available
    def versions(self, model_key: str) -> list[ModelRecord]:
        records, unreadable = self.readable_versions(model_key)
        if unreadable:
            raise unreadable[0]
        return records

    @_available
    def readable_versions(self, model_key: str) -> tuple[list[ModelRecord], list[CorruptRecordError]]:
        records, unreadable = [], []
        for v in self._kept(model_key):
            try:
                records.append(self._record(model_key, v))
            except ModelNotFoundError:  # trimmed meanwhile
                continue
            except CorruptRecordError as exc:
                unreadable.append(exc)
        return records, unreadable

    @_available
    def promote(self, model_key: str, version: int, replacing: int | None = None) -> ModelRecord:
        with self._locked(model_key) as d:
            return self._promote_locked(model_key, version, d, replacing)

    @_available
    def rollback(self, model_key: str, to_version: int | None = None) -> ModelRecord:
        with self._locked(model_key) as d:
            if to_version is None:
                to_version = previous_version(model_key, self._kept(model_key), self._current_version(model_key))
            return self._promote_locked(model_key, to_version, d)

    def _promote_locked(self, model_key: str, version: int, d: Path, replacing: int | None = None) -> ModelRecord:
        record = self._record(model_key, version)
        check_current(model_key, replacing, self._current_version(model_key))
        _atomic_write(d / CURRENT, str(version).encode())
        self._trim(model_key, d)
        log.info("model %s: version %d is current", model_key, version)
        return record

    @_available
    def keys(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(d.name for d in self.path.iterdir() if d.is_dir() and any(d.glob(f"*{META}")))
