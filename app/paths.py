"""Whether a command can write the file it writes at its end, asked at its start without changing anything there
(``rttsched sim``/``demo``'s report, ``rttsched select --json``): a run that fails after its work is work lost."""

from __future__ import annotations

import tempfile
from pathlib import Path


def not_a_file(path: Path) -> str | None:
    """What is at ``path`` where a regular file should be (``a directory``, ``not a file``: a FIFO would block the
    write, a device take it), or None: nothing there, or a regular file (a link to one too)."""
    if not path.exists() or path.is_file():
        return None
    return "a directory" if path.is_dir() else "not a file"


def cannot_write(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (one there, a link, or none yet), tried without changing it; None
    when it can.

    >>> cannot_write(Path("/proc/nope.json"))
    'cannot write /proc/nope.json: No such file or directory'
    """
    try:
        if path.exists():
            with path.open("ab"):  # appends nothing: the file is left as it is
                pass
        else:  # a new file, or a link to one not there yet: its directory must take one
            with tempfile.TemporaryFile(dir=path.resolve().parent):
                pass
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
