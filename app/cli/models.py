"""``rttsched models``: the model versions of the registry, what model-updates announced, and a rollback.

``list`` and ``show`` read the registry (``REDIS_URL``, else ``RTT_MODELS_DIR``) and model-updates (read from its
start, no consumer group: nothing running is disturbed); a key whose current version is not the newest announced
is flagged: the workers and extenders serve the announced one. ``rollback`` goes back the way the system applies
it (:mod:`app.trainer.rollback`): the verified blob of the version gone back to is saved again as a new version
above everything given and announced, made current and announced with the trainer's message, so every worker and
extender loads it and the trainer's next retrain judges its challenger against it. Without ``--yes`` it asks
first, and refuses where there is no terminal to ask on. It replaces the current version it showed, or nothing:
when the trainer promoted a retrain before the rollback landed, it says so and changes nothing (exit status 2).

A record of the registry that cannot be read (:class:`~app.registry.base.CorruptRecordError`: metadata that is not
JSON or lacks a field, a current pointer that is not a number, a Redis key of the wrong type) does not hide the
others: ``list`` and ``show`` print what they can read, mark what they cannot with ``?``, say on stderr which
record and why (one line each, as every error of the command), and exit 2. ``rollback`` refuses (exit status 2)
when it needs such a record: the current one, the one to go back to, or one a default target would skip.

A version whose record reads but whose blob cannot serve (:class:`~app.registry.base.BlobError`: the blob gone, a
Redis key evicted or deleted, a file removed) is marked the same way (``?``, one line on stderr, exit status 2); the
look is cheap (:meth:`~app.registry.base.ModelStore.check_blobs`: one Redis round trip per key, a file ``stat``), no
blob is read. ``--verify`` reads every kept blob and checks its sha256 against its record too, so a blob changed or
truncated in place is found before a process fails to load it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

from app.cli.output import printable, table

HELP = "list the model versions of the registry and model-updates, show one key's versions, roll a key back"
NOT_A_TERMINAL = "stdin is not a terminal to ask on: add --yes to roll back without asking"


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="every model key: current version, sha256, when saved, fit rows, holdout "
                            "metrics, versions kept, newest announced (flagged where they differ)",
                            description="Every model key of the registry and of model-updates.")
    ls.add_argument("--app", default=None, help="only this app's keys")
    ls.add_argument("--json", action="store_true", help="one JSON array instead of the table")
    verify = ("read every kept version's blob and check its sha256 against its record (reads every blob; without it "
              "only whether each blob is there is looked at)")
    ls.add_argument("--verify", action="store_true", help=verify)
    show = actions.add_parser("show", help="every kept version of KEY with its record",
                              description="Every kept version of a model key, which is current, which announced.")
    show.add_argument("key", metavar="KEY", help="model key, e.g. gCTF:gpu")
    show.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    show.add_argument("--verify", action="store_true", help=verify)
    back = actions.add_parser("rollback", help="go back to an earlier version of KEY: saved again as a new "
                              "version, made current and announced on model-updates",
                              description="Go back to an earlier version of a model key, as the running system "
                              "applies it: its blob saved again as a new version above every version given and "
                              "announced, made current, announced on model-updates.")
    back.add_argument("key", metavar="KEY", help="model key, e.g. gCTF:gpu")
    back.add_argument("--to", type=int, default=None, metavar="VERSION",
                      help="the kept version to go back to (default: the one before the model the current "
                           "version serves, among the kept versions with another blob)")
    back.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    for sub in (ls, show, back):
        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")


def when(ts: float | None, seconds: bool = True) -> str:
    """Unix seconds as UTC (to the second, or to the minute), ``-`` for none.

    >>> when(1_700_000_000.0), when(1_700_000_000.0, seconds=False), when(None)
    ('2023-11-14 22:13:20Z', '2023-11-14 22:13Z', '-')
    """
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ" if seconds else "%Y-%m-%d %H:%MZ", time.gmtime(ts))


def trained_on(window: tuple[float, float] | None) -> str:
    """A training window in UTC, its end's date left out when it is the start's.

    >>> trained_on((1_700_000_000.0, 1_700_003_600.0)), trained_on(None)
    ('2023-11-14 22:13:20Z..23:13:20Z', '-')
    """
    if window is None:
        return "-"
    start, end = when(window[0]), when(window[1])
    return f"{start}..{end[11:] if end[:10] == start[:10] else end}"


def figure(metrics: dict[str, float], name: str, fmt: str = "{:.1f}") -> str:
    """One holdout metric as text, ``-`` where the record has none.

    >>> figure({"rmse_ms": 41.234}, "rmse_ms"), figure({}, "mape")
    ('41.2', '-')
    """
    return fmt.format(metrics[name]) if name in metrics else "-"


def _origin(record: Any) -> str:
    return f"the model of v{record.restores}" if record.restores is not None else ""


def _key(text: str) -> str:
    """``text`` if the registry can hold it as a model key, else :class:`~app.errors.ConfigError` naming KEY."""
    from app.errors import ConfigError
    from app.model.errors import RegistryError
    from app.registry.base import check_model_key

    try:
        return check_model_key(text)
    except RegistryError as exc:
        raise ConfigError("KEY", str(exc)) from None


def _announced(settings: Any) -> dict[str, Any]:
    """The newest version announced per key on model-updates."""
    import asyncio

    from app.trainer.announcements import read_announced

    return asyncio.run(read_announced(settings))


@dataclasses.dataclass
class Look:
    """What the registry holds of one key: its ``current`` record (None: none, or unreadable:
    ``current_unreadable`` is then the error), its readable ``kept`` records (None: not even which versions are kept
    could be read), the kept versions whose record is unreadable (``bad``: version -> error), ``unreadable``: an
    error per record that could not be read, the current one first, and ``blobs``: the readable versions whose blob
    cannot serve (version -> :class:`~app.registry.base.BlobError`)."""

    current: Any = None
    current_unreadable: Any = None
    kept: list[Any] | None = dataclasses.field(default_factory=list)
    bad: dict[int, Any] = dataclasses.field(default_factory=dict)
    unreadable: list[Any] = dataclasses.field(default_factory=list)
    blobs: dict[int, Any] = dataclasses.field(default_factory=dict)

    def n_kept(self) -> str:
        """The versions kept, `` ?`` after it where some cannot be read or their blob cannot serve, ``?`` where which
        is not known."""
        if self.kept is None:
            return "?"
        kept = {r.version for r in self.kept} | set(self.bad)
        return f"{len(kept)}{' ?' if self.bad or self.blobs.keys() & kept else ''}"

    def errors(self) -> list[Any]:
        """Every error of the key: its unreadable records', then its blobs' by version."""
        return [*self.unreadable, *(self.blobs[v] for v in sorted(self.blobs))]


def _look(store: Any, key: str, verify: bool = False) -> Look:
    """The registry's records of ``key``, each that cannot be read kept as its error, and whether the blob of each
    readable one is there (``verify``: and its sha256 the record's). RegistryUnavailableError, the registry away, is
    raised: nothing can be read."""
    from app.model.errors import RegistryError, RegistryUnavailableError

    look = Look()
    try:
        look.current = store.current(key)
    except RegistryUnavailableError:
        raise
    except RegistryError as exc:
        look.current_unreadable = exc
        look.unreadable.append(exc)
    try:
        look.kept, unreadable = store.readable_versions(key)
        look.bad = {e.version: e for e in unreadable}
    except RegistryUnavailableError:
        raise
    except RegistryError as exc:
        look.kept, unreadable = None, [exc]
    said = {str(e) for e in look.unreadable}  # the current record's error, which the versions read again
    look.unreadable += [e for e in unreadable if str(e) not in said]
    records = {r.version: r for r in look.kept or []}
    if look.current is not None:
        records.setdefault(look.current.version, look.current)
    try:
        if records:
            look.blobs = {e.version: e for e in store.check_blobs(key, [records[v] for v in sorted(records)], verify)}
    except RegistryUnavailableError:
        raise
    except RegistryError as exc:
        look.unreadable.append(exc)
    return look


def _unreadable(looks: Sequence[Look]) -> int:
    """Say each record that could not be read, and each blob that cannot serve, on stderr, one line each; the exit
    status (2 where there was one)."""
    errors = [str(e) for look in looks for e in look.errors()]
    for error in errors:
        print(f"rttsched models: error: {error}", file=sys.stderr)
    return 2 if errors else 0


def _read(settings: Any) -> tuple[Any, dict[str, Any]]:
    """The store, once it answered, and the newest version announced per key on model-updates."""
    from app.registry.store import open_store

    store = open_store(settings)
    store.keys()  # the registry first: it answers at once, or not at all
    return store, _announced(settings)


def list_models(args: argparse.Namespace, settings: Any) -> int:
    import orjson

    store, announced = _read(settings)
    keys = sorted(set(store.keys()) | set(announced))
    if args.app is not None:
        keys = [k for k in keys if k.split(":", 1)[0] == args.app]
    rows, out, looks = [], [], []
    for key in keys:
        look, news = _look(store, key, args.verify), announced.get(key)
        looks.append(look)
        current, kept = look.current, look.kept
        agrees = current is not None and news is not None and (current.version, current.sha256) == (
            news.version, news.sha256)
        entry = {"model_key": key, "current": current.to_dict() if current is not None else None,
                 "kept": sorted({*(r.version for r in kept), *look.bad}) if kept is not None else None,
                 "announced": news.__dict__ if news is not None else None, "agrees": agrees}
        if look.unreadable:
            entry["unreadable"] = [str(e) for e in look.unreadable]
        if look.blobs:
            entry["bad_blobs"] = [str(look.blobs[v]) for v in sorted(look.blobs)]
        out.append(entry)
        if look.current_unreadable is not None:  # its version where that is known
            bad = getattr(look.current_unreadable, "version", None)
            cells = [f"v{bad} ?" if bad is not None else "?", "-", "-", "-", "-", "-"]
        elif current is None:
            cells = ["-", "-", "-", "-", "-", "-"]
        else:
            restores = f" (=v{current.restores})" if current.restores is not None else ""
            mark = " ?" if current.version in look.blobs else ""
            cells = [f"v{current.version}{restores}{mark}", current.sha256[:12],
                     when(current.created_ts, seconds=False), str(current.n_samples),
                     figure(current.metrics, "rmse_ms"), figure(current.metrics, "mape", "{:.3f}")]
        said = f"v{news.version}" if news is not None else "-"
        flagged = not agrees and look.current_unreadable is None  # an unreadable current is flagged ? already
        rows.append([printable(key), *cells, look.n_kept(), f"{said} !" if flagged else said])
    if args.json:
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return _unreadable(looks)
    if not rows:
        print("no models" + (f" of app {args.app!r}" if args.app is not None else "") + " in the registry or on "
              "model-updates")
        return 0
    head = ("KEY", "CURRENT", "SHA256", "SAVED (UTC)", "ROWS", "RMSE MS", "MAPE", "KEPT", "ANNOUNCED")
    print("\n".join(table(head, rows, right=frozenset({4, 5, 6, 7}))))
    if any("(=v" in r[1] for r in rows):
        print("(=vN): a rollback to the model of vN, saved again under a new version")
    if any(r[-1].endswith("!") for r in rows):
        print("!: the registry's current version is not the newest announced on model-updates (the workers and "
              "extenders serve that one): rttsched models show KEY")
    if any(look.unreadable for look in looks):
        print("?: a record of the registry cannot be read (which, and why: on stderr): rttsched models show KEY")
    if any(look.blobs for look in looks):
        print("?: a version's model blob is missing or not the one its record names, no process can load it (which, "
              "and why: on stderr): rttsched models show KEY")
    sys.stdout.flush()  # the table before the lines saying what it lacks
    return _unreadable(looks)


def show_model(args: argparse.Namespace, settings: Any) -> int:
    import orjson

    from app.errors import ConfigError
    from app.registry.base import MISSING_BLOB

    key = _key(args.key)
    store, announced = _read(settings)
    look, news = _look(store, key, args.verify), announced.get(key)
    current, kept = look.current, look.kept or []
    if not kept and not look.unreadable and news is None:
        raise ConfigError("KEY", f"no model {key!r} in the registry or on model-updates (rttsched models list)")
    # the version the current pointer names when only its record is unreadable
    bad_current = getattr(look.current_unreadable, "version", None)
    current_version = current.version if current is not None else bad_current
    if args.json:
        shown: dict[str, Any] = {"model_key": key, "current": current_version,
                                 "announced": news.__dict__ if news is not None else None,
                                 "versions": [r.to_dict() for r in kept]}
        if look.unreadable:
            shown["unreadable"] = [str(e) for e in look.unreadable]
        if look.blobs:
            shown["bad_blobs"] = [str(look.blobs[v]) for v in sorted(look.blobs)]
        print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
        return _unreadable([look])
    said = f"announced v{news.version} (sha256 {news.sha256[:12]}, {when(news.ts)})" if news else "never announced"
    if look.current_unreadable is not None:
        now = f"v{bad_current} ?" if bad_current is not None else "?"
    else:
        now = f"v{current_version}{' ?' if current_version in look.blobs else ''}" if current_version is not None \
            else "none"
    print(f"{key}: current {now}, {said}")
    rows = []
    records = {r.version: r for r in kept}
    for version in sorted({*records, *look.bad}):
        state = [s for s, yes in (("current", version == current_version),
                                  ("announced", news is not None and version == news.version)) if yes]
        if version not in records:  # unreadable: why, and where, in its line on stderr
            rows.append([f"v{version}", ",".join([*state, "unreadable"]), *["-"] * 8, ""])
            continue
        r = records[version]
        if version in look.blobs:  # why, and where, in its line on stderr
            state.append("no-blob" if look.blobs[version].problem == MISSING_BLOB else "bad-blob")
        window = trained_on(r.training_window)
        rows.append([f"v{r.version}", ",".join(state), r.sha256[:12], when(r.created_ts), str(r.n_samples),
                     figure(r.metrics, "rmse_ms"), figure(r.metrics, "mae_ms"), figure(r.metrics, "mape", "{:.3f}"),
                     str(len(r.features)), window, _origin(r)])
    head = ("VERSION", "STATE", "SHA256", "SAVED (UTC)", "ROWS", "RMSE MS", "MAE MS", "MAPE", "FEATURES",
            "TRAINED ON (UTC)", "")
    print("\n".join(table(head, rows, right=frozenset({4, 5, 6, 7, 8}))))
    if news is not None and look.kept is not None and not any(r.version == news.version for r in kept) and (
            news.version not in look.bad):
        print(f"! the announced v{news.version} is not in the registry (the trainer's registry check replaces it)")
    sys.stdout.flush()  # the table before the lines saying what it lacks
    return _unreadable([look])


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def roll_back_model(args: argparse.Namespace, settings: Any) -> int:
    import asyncio
    import dataclasses

    from app.errors import ConfigError, RttError
    from app.registry.store import open_store
    from app.trainer.announcements import announce
    from app.trainer.registry import ModelRegistry
    from app.trainer.rollback import plan_rollback, roll_back, served

    key = _key(args.key)
    if args.to is not None and args.to < 1:
        raise ConfigError("--to", f"must be a version >= 1 (got {args.to})")
    if not args.yes and not (sys.stdin is not None and sys.stdin.isatty()):
        raise ConfigError("--yes", NOT_A_TERMINAL)
    store = open_store(settings)
    plan = plan_rollback(store, key, args.to)  # the registry's answer first: it comes at once, or not at all
    news = _announced(settings).get(key)
    plan = dataclasses.replace(plan, announced=news.version if news is not None else 0)
    cur, target = plan.current, plan.target
    print(f"{key}: current v{cur.version} (sha256 {cur.sha256[:12]}, saved {when(cur.created_ts)})\n"
          f"  back to v{target.version} ({(_origin(target) + ', ') if target.restores is not None else ''}"
          f"sha256 {target.sha256[:12]}, saved {when(target.created_ts)}), saved again "
          f"as a new version above v{max(plan.announced, cur.version)}")
    if not args.yes and not _confirm(f"Roll {key} back to v{target.version}?"):
        print(f"rttsched models: {key} not rolled back", file=sys.stderr)
        return 1
    fields = roll_back(ModelRegistry(store=store), plan)
    new = int(fields["version"])
    try:
        asyncio.run(announce(settings, fields))
    except RttError as exc:
        raise RttError(f"{key}: v{new} (the model of v{served(target)}) is current in the registry but not announced:"
                       f" {exc}; a running trainer announces it at its second registry check (RTT_REGISTRY_CHECK_S)"
                       ) from None
    print(f"{key}: v{cur.version} -> v{new} (the model of v{served(target)}, sha256 {fields['sha256'][:12]}): "
          f"current in the registry, announced on model-updates")
    return 0


def run(args: argparse.Namespace, settings: Any) -> int:
    from app.errors import RttError
    from app.model.errors import RegistryUnavailableError

    action = {"list": list_models, "show": show_model, "rollback": roll_back_model}[args.action]
    try:
        return action(args, settings)
    except RegistryUnavailableError as exc:  # named by the setting that points at it, or gives it its password
        if settings.redis_url:
            from app.redis_client import password_setting, refused_login

            raise RttError(f"{exc} ({password_setting(settings) if refused_login(exc) else 'REDIS_URL'})") from None
        raise RttError(f"{exc} (RTT_MODELS_DIR)") from None
