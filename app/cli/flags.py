"""A command's flags that override settings: errors name the flag when the value came from it."""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def flag_errors(args: argparse.Namespace, flags: Mapping[str, str]) -> Iterator[None]:
    """Name the flag, not its environment variable, in a :class:`~app.errors.ConfigError` about a value the
    flag gave.

    ``flags``: flag -> the environment variable it overrides, e.g. ``{"--ttl": "RTT_PODS_TTL_S"}``; a flag
    counts as given when its ``args`` attribute is not None. The variable of a given flag is replaced in the
    error's field and in its message; an error about a value from the environment keeps naming the variable.

    >>> from app.errors import ConfigError
    >>> args = argparse.Namespace(ttl=5.0, resync=10.0)
    >>> with flag_errors(args, {"--ttl": "RTT_PODS_TTL_S", "--resync": "RTT_PODS_RESYNC_S"}):
    ...     raise ConfigError("RTT_PODS_TTL_S", "must be >= RTT_PODS_RESYNC_S (got 5.0)")
    Traceback (most recent call last):
    ...
    app.errors.ConfigError: --ttl: must be >= --resync (got 5.0)
    """
    from app.errors import ConfigError

    given = {env: flag for flag, env in flags.items()
             if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None}
    try:
        yield
    except ConfigError as exc:
        if not given:
            raise
        names = re.compile(r"\b(" + "|".join(map(re.escape, given)) + r")\b")
        field, message = (names.sub(lambda m: given[m[1]], text) for text in (exc.field, exc.message))
        if (field, message) == (exc.field, exc.message):
            raise
        raise ConfigError(field, message) from None


def writable_dir(path: str, field: str) -> Path:
    """``path`` created if missing and tried with a file, so that a directory a command cannot use fails at its
    start naming ``field`` (a flag or a variable), not in its first write.

    >>> writable_dir("/proc/nope", "--out")
    Traceback (most recent call last):
    ...
    app.errors.ConfigError: --out: cannot create /proc/nope: No such file or directory
    """
    from app.errors import ConfigError

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(field, f"{path} exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(field, f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ConfigError(field, f"cannot write in {path}: {exc.strerror or exc}") from None
    return out


def writable_file(path: str | Path, field: str) -> Path:
    """``path`` tried as the file a command writes at its end, without changing it, so that one it cannot
    write fails at its start naming ``field``, not after the work (as :func:`writable_dir` does for a
    directory): a directory there, a file that cannot be written, a directory that is missing or takes no file.

    >>> writable_file("/proc/nope.json", "--json")
    Traceback (most recent call last):
    ...
    app.errors.ConfigError: --json: cannot write /proc/nope.json: No such file or directory
    """
    from app.errors import ConfigError
    from app.paths import cannot_write, not_a_file

    out = Path(path)
    if kind := not_a_file(out):
        raise ConfigError(field, f"{path} is {kind}, where a file is written")
    if problem := cannot_write(out):
        raise ConfigError(field, problem)
    return out
