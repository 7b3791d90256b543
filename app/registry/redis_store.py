"""The model registry in Redis: blobs and JSON metadata, written together in one MULTI/EXEC.

Keys, under ``<namespace>`` (model keys contain ``:`` themselves; the suffixes keep keys unique):

* ``<ns>:models`` — set of model keys
* ``<ns>:model:<key>:seq`` — version counter (``INCR``: versions are never reused; a save raises it above
  the newest version announced on model-updates, which a Redis that lost its data no longer knows)
* ``<ns>:model:<key>:versions`` — sorted set of kept versions
* ``<ns>:model:<key>:blob:<v>`` / ``:meta:<v>`` — the blob and its :class:`ModelRecord` JSON
* ``<ns>:model:<key>:current`` — the current version

A blob and its metadata are set (and deleted) in one transaction, so a reader never sees one without
the other; readers fetch both in one transaction too. Moving ``current`` and trimming old versions
``WATCH`` the keys they depend on and retry when another writer got there first. A promotion ``replacing`` a
version (compare-and-set, :class:`~app.registry.base.ModelStore`) watches ``current``, checks it and moves
it in one MULTI/EXEC, so no other writer's promotion lands between the check and the move; a save that promotes
writes its blob, metadata and ``current`` in that same transaction (refused: nothing written, its version number
spent).

Redis being away (connection refused or lost, a timeout, still loading its data) surfaces as
:class:`~app.model.errors.RegistryUnavailableError` from every method, so a caller can tell "try again
later" from a model that is missing or corrupt. So does a Redis that answers but refuses writes
(:func:`refuses_writes`): out of memory under ``maxmemory-policy noeviction`` (``OOM``), a replica (``READONLY``,
after a failover demoted it), a failed snapshot under ``stop-writes-on-bgsave-error`` (``MISCONF``), a replica
whose master is away (``MASTERDOWN``), a cluster slot moving (``TRYAGAIN``), too few replicas in reach under
``min-replicas-to-write`` (``NOREPLICAS``).
:meth:`RedisModelStore.check_writable` tells when it takes a write again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from app.clock import Clock, SystemClock
from app.model.errors import ModelNotFoundError, RegistryError, RegistryUnavailableError
from app.redis_client import DEFAULT_TIMEOUT_S, redis_client
from app.registry.base import (
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


F = TypeVar("F", bound=Callable[..., Any])
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# replies of a Redis that answers but takes no write now, as redis-py raises them
REFUSED = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError,
           redis.exceptions.TryAgainError)
# the same by error code, for a reply redis-py raises as a plain ResponseError (MISCONF has no class of its own)
REFUSED_CODES = frozenset({"OOM", "READONLY", "MISCONF", "MASTERDOWN", "TRYAGAIN", "LOADING", "NOREPLICAS"})
PROBE_TTL_MS = 10_000  # a write probe left behind by a lost connection expires after this


def _reply_code(exc: BaseException) -> str:
    """The error code of the reply Redis answered ``exc`` with (its first word), also where a pipeline named its
    command before it; ``""`` for what is no error reply.

    >>> _reply_code(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    'WRONGTYPE'
    >>> _reply_code(redis.ResponseError("Command # 2 (SET k v) of pipeline caused error: MISCONF Errors writing"))
    'MISCONF'
    >>> _reply_code(redis.ConnectionError("Connection refused")), _reply_code(ValueError("OOM"))
    ('', '')
    """
    if not isinstance(exc, redis.ResponseError):
        return ""
    return str(exc).rpartition("caused error: ")[2].split(" ", 1)[0]


def refuses_writes(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis answering that it takes no write now (full, a replica, unable to persist): a
    condition to wait out, as Redis being away — not a broken request.

    >>> refuses_writes(redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
    True
    >>> refuses_writes(redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently "
    ...                                    "unable to persist to disk."))
    True
    >>> refuses_writes(redis.ResponseError("Command # 2 (SET k v) of pipeline caused error: MISCONF Errors writing "
    ...                                    "to the AOF file"))
    True
    >>> refuses_writes(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    False
    """
    return isinstance(exc, REFUSED) or _reply_code(exc) in REFUSED_CODES


def wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command on a key that holds another kind of value (a key set by hand).

    >>> wrong_type(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    True
    >>> wrong_type(redis.ResponseError("Command # 1 (GET k) of pipeline caused error: WRONGTYPE Operation against "
    ...                                "a key holding the wrong kind of value"))
    True
    >>> wrong_type(redis.ResponseError("NOPERM this user has no permissions to run the 'get' command"))
    False
    """
    return _reply_code(exc) == "WRONGTYPE"


def _available(method: F) -> F:
    """Turn Redis being away, or refusing writes, into :class:`RegistryUnavailableError` (with where and why), and a
    key of the model that holds the wrong kind of value into :class:`CorruptRecordError` naming the model."""

    @functools.wraps(method)
    def wrapper(self: RedisModelStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except redis.RedisError as exc:
            model_key = args[0] if args else kwargs.get("model_key")
            if wrong_type(exc) and isinstance(model_key, str):
                raise CorruptRecordError(model_key, None, f"a Redis key of it holds the wrong kind of value: {exc}",
                                         self._where) from exc
            if not isinstance(exc, UNAVAILABLE) and not refuses_writes(exc):
                raise
            raise RegistryUnavailableError(f"model registry at {self._where} unavailable: "
                                           f"{type(exc).__name__}: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def _text(raw: Any, limit: int = 40) -> str:
    """A value Redis returned, for a message: decoded and quoted, cut to ``limit`` characters.

    >>> _text(b"notanumber"), _text(b"x" * 50)
    ("'notanumber'", "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'")
    """
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _version(raw: Any, model_key: str, where: str) -> int | None:
    """The version a GET of ``model_key``'s ``current`` key (``where``) returned (None: no current version);
    :class:`CorruptRecordError` when it is not a version number."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise CorruptRecordError(model_key, None, f"its current version {_text(raw)} is not a version number",
                                 where) from None


def _ints(values: Any, model_key: str, where: str) -> list[int]:
    """Sorted ints of what ZRANGE of ``model_key``'s ``versions`` (``where``) returned (redis-py's return types are
    too wide for mypy); :class:`CorruptRecordError` for a member that is not a version number."""
    out = []
    for v in values:
        try:
            out.append(int(v))
        except ValueError:
            raise CorruptRecordError(model_key, None, f"its kept versions hold {_text(v)}, not a version number",
                                     where) from None
    return sorted(out)


class RedisModelStore:
    """:class:`~app.registry.base.ModelStore` in Redis at ``url`` (``redis://host:port/db``); a call Redis does not
    answer in ``timeout_s`` raises :class:`~app.model.errors.RegistryUnavailableError`."""

    def __init__(self, url: str, keep: int = 5, namespace: str = "rttsched", clock: Clock | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not namespace or any(c.isspace() for c in namespace):
            raise ValueError(f"namespace: must be a non-empty word (got {namespace!r})")
        self.keep = check_keep(keep)
        self.namespace = namespace
        self._redis = redis_client(url, timeout_s)
        self._clock = clock or SystemClock()
        kw = self._redis.connection_pool.connection_kwargs
        self._where = f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"

    @property
    def client(self) -> redis.Redis:
        """The underlying redis-py client (for health checks and operations tooling)."""
        return self._redis

    def close(self) -> None:
        self._redis.close()

    @_available
    def check_writable(self, model_key: str) -> None:
        """Write a short-lived probe key of ``model_key`` and delete it: :class:`RegistryUnavailableError` while Redis
        is away or refuses writes (:func:`refuses_writes`), so a caller can wait before training a model Redis would
        not take. One byte: a probe the size of a model could itself push a Redis near its ``maxmemory`` to evict."""
        probe = self._k(model_key, "probe")
        self._redis.set(probe, b"1", px=PROBE_TTL_MS)
        self._redis.delete(probe)

    # -- key names
    def _k(self, model_key: str, *parts: object) -> str:
        return ":".join([self.namespace, "model", check_model_key(model_key), *map(str, parts)])

    def _kind(self, key: str) -> str:
        """What ``key`` holds, for a message: ``a Redis hash``."""
        try:
            return f"a Redis {_text(self._redis.type(key))[1:-1]}"
        except redis.RedisError:
            return "a Redis key of another type"

    def _mistyped(self, model_key: str, version: int | None, key: str, what: str, expected: str) -> CorruptRecordError:
        """``key`` of ``model_key`` (``what`` it is) holds another kind of value than ``expected``."""
        return CorruptRecordError(model_key, version, f"{what} is {self._kind(key)}, not a {expected}", key)

    def _current_version(self, model_key: str) -> int | None:
        key = self._k(model_key, "current")
        try:
            raw = self._redis.get(key)
        except redis.ResponseError as exc:
            if not wrong_type(exc):
                raise
            raise self._mistyped(model_key, None, key, "its current version", "string") from None
        return _version(raw, model_key, key)

    def _kept(self, model_key: str) -> list[int]:
        key = self._k(model_key, "versions")
        try:
            values = self._redis.zrange(key, 0, -1)
        except redis.ResponseError as exc:
            if not wrong_type(exc):
                raise
            raise self._mistyped(model_key, None, key, "its set of kept versions", "sorted set") from None
        return _ints(values, model_key, key)

    def _parse(self, model_key: str, version: int, raw: Any) -> ModelRecord:
        return read_record(raw, model_key, version, self._k(model_key, "meta", version))

    def _record(self, model_key: str, version: int) -> ModelRecord:
        key = self._k(model_key, "meta", version)
        try:
            raw = self._redis.get(key)
        except redis.ResponseError as exc:
            if not wrong_type(exc):
                raise
            raise self._mistyped(model_key, version, key, "its metadata", "string") from None
        if raw is None:
            raise ModelNotFoundError(model_key, version)
        return self._parse(model_key, version, raw)

    def _trim(self, model_key: str) -> None:
        versions_key, current_key = self._k(model_key, "versions"), self._k(model_key, "current")
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(versions_key, current_key)
                    kept = _ints(pipe.zrange(versions_key, 0, -1), model_key, versions_key)
                    drop = versions_to_drop(kept, _version(pipe.get(current_key), model_key, current_key), self.keep)
                    if not drop:
                        pipe.unwatch()
                        return
                    pipe.multi()
                    pipe.zrem(versions_key, *drop)
                    for v in drop:
                        pipe.delete(self._k(model_key, "blob", v), self._k(model_key, "meta", v))
                    pipe.execute()
                    log.debug("model %s: dropped versions %s", model_key, drop)
                    return
                except redis.WatchError:
                    continue

    # -- ModelStore
    @_available
    def save(
        self, model_key: str, blob: bytes, *, fmt: str, features: Sequence[str], params: Mapping[str, Any],
        metrics: Mapping[str, float], n_samples: int, training_window: tuple[float, float] | None = None,
        after: int = 0, restores: int | None = None, replacing: int | None = None,
    ) -> ModelRecord:
        check_model_key(model_key)
        seq = self._k(model_key, "seq")
        version = int(self._redis.incr(seq))
        if version <= after:  # the counter restarted below what was announced (Redis lost its data)
            version = int(self._redis.incrby(seq, after + 1 - version))
        blob_key = self._k(model_key, "blob", version)
        record = new_record(
            model_key, version, blob, fmt=fmt, features=features, params=params, metrics=metrics,
            n_samples=n_samples, training_window=training_window, created_ts=self._clock.now(), restores=restores,
            location=f"{self._where}#{blob_key}",
        )
        current_key = self._k(model_key, "current")
        with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    if replacing is not None:  # checked and moved in the transaction that stores the version
                        pipe.watch(current_key)
                        try:
                            check_current(model_key, replacing, _version(pipe.get(current_key), model_key,
                                                                         current_key))
                        except RegistryError:
                            pipe.unwatch()
                            raise
                        pipe.multi()
                    pipe.set(blob_key, blob)
                    pipe.set(self._k(model_key, "meta", version), record.to_json())
                    pipe.zadd(self._k(model_key, "versions"), {str(version): version})
                    pipe.sadd(f"{self.namespace}:models", model_key)
                    if replacing is not None:
                        pipe.set(current_key, version)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        self._trim(model_key)
        log.info("model %s: saved version %d (%d bytes)%s", model_key, version, len(blob),
                 ": current" if replacing is not None else "")
        return record

    @_available
    def load(self, model_key: str, version: int | None = None) -> tuple[bytes, ModelRecord]:
        if version is None:
            version = self._current_version(model_key)
            if version is None:
                raise ModelNotFoundError(model_key, detail=f"model {model_key!r} has no current version")
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._k(model_key, "blob", version))
            pipe.get(self._k(model_key, "meta", version))
            blob, meta = pipe.execute()
        if blob is None or meta is None:
            raise ModelNotFoundError(model_key, version)
        record = self._parse(model_key, version, meta)
        return verify(model_key, version, bytes(blob), record.sha256), record

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
        return bool(self._redis.exists(self._k(record.model_key, "blob", record.version)))

    @_available
    def check_blobs(self, model_key: str, records: Sequence[ModelRecord], read: bool = False) -> list[BlobError]:
        # what a blob key holds and whether the metadata is still there, in one transaction: a version trimmed
        # meanwhile lost both at once (a whole key's records in one round trip; with ``read``, one blob at a time)
        errors = []
        for batch in ([[r] for r in records] if read else [list(records)] if records else []):
            with self._redis.pipeline(transaction=True) as pipe:
                for record in batch:
                    blob_key = self._k(model_key, "blob", record.version)
                    pipe.type(blob_key)
                    if read:
                        pipe.get(blob_key)
                    pipe.exists(self._k(model_key, "meta", record.version))
                answered = pipe.execute(raise_on_error=False)  # a GET of a key of another type answers WRONGTYPE
            for reply in answered:
                if isinstance(reply, redis.RedisError) and not wrong_type(reply):
                    raise reply
            replies = iter(answered)
            for record in batch:
                kind = _text(next(replies))[1:-1]
                blob = next(replies) if read else None
                problem = self._blob_problem(kind, blob, record, meta_stored=bool(next(replies)))
                if problem is not None:
                    errors.append(BlobError(model_key, record.version, problem,
                                            self._k(model_key, "blob", record.version)))
        return errors

    @staticmethod
    def _blob_problem(kind: str, blob: Any, record: ModelRecord, meta_stored: bool) -> str | None:
        """What is wrong with the blob of ``record`` whose key holds ``kind`` (and, read, ``blob``), None where
        nothing: none while its metadata is gone too (trimmed meanwhile)."""
        if kind == "none":
            return MISSING_BLOB if meta_stored else None
        if kind != "string":
            return f"its blob is a Redis {kind}, not a string"
        return blob_mismatch(blob, record) if isinstance(blob, bytes) else None  # None: not read

    @_available
    def versions(self, model_key: str) -> list[ModelRecord]:
        records, unreadable = self._versions(model_key)
        if unreadable:
            raise unreadable[0]
        return records

    @_available
    def readable_versions(self, model_key: str) -> tuple[list[ModelRecord], list[CorruptRecordError]]:
        return self._versions(model_key)

    def _versions(self, model_key: str) -> tuple[list[ModelRecord], list[CorruptRecordError]]:
        kept = self._kept(model_key)
        if not kept:
            return [], []
        raws = self._redis.mget([self._k(model_key, "meta", v) for v in kept])
        records, unreadable = [], []
        for version, raw in zip(kept, raws, strict=True):
            if raw is None:  # trimmed meanwhile, or (MGET answers nil for it too) a key that is not a string
                meta = self._k(model_key, "meta", version)
                if self._redis.type(meta) not in (b"none", "none"):
                    unreadable.append(self._mistyped(model_key, version, meta, "its metadata", "string"))
                continue
            try:
                records.append(self._parse(model_key, version, raw))
            except CorruptRecordError as exc:
                unreadable.append(exc)
        return records, unreadable

    @_available
    def promote(self, model_key: str, version: int, replacing: int | None = None) -> ModelRecord:
        meta_key, current_key = self._k(model_key, "meta", version), self._k(model_key, "current")
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(meta_key, current_key)
                    raw = pipe.get(meta_key)
                    try:
                        if raw is None:
                            raise ModelNotFoundError(model_key, version)
                        record = self._parse(model_key, version, raw)  # unreadable: the pointer stays
                        check_current(model_key, replacing, _version(pipe.get(current_key), model_key, current_key))
                    except RegistryError:
                        pipe.unwatch()
                        raise
                    pipe.multi()
                    pipe.set(current_key, version)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        self._trim(model_key)
        log.info("model %s: version %d is current", model_key, version)
        return record

    @_available
    def rollback(self, model_key: str, to_version: int | None = None) -> ModelRecord:
        if to_version is None:  # back from the current version read here, and only from it
            current = self._current_version(model_key)
            return self.promote(model_key, previous_version(model_key, self._kept(model_key), current), current)
        return self.promote(model_key, to_version)

    @_available
    def keys(self) -> list[str]:
        key = f"{self.namespace}:models"
        try:
            members = self._redis.smembers(key)
        except redis.ResponseError as exc:
            if not wrong_type(exc):
                raise
            raise RegistryError(f"model registry at {self._where}: {key}, the set of model keys, is "
                                f"{self._kind(key)}, not a set") from None
        return sorted(k.decode("utf-8", "backslashreplace") if isinstance(k, bytes) else str(k) for k in members)
