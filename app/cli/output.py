"""Writing to a stdout that may be gone: a reader that went away (``| head``), a terminal that hung up."""

from __future__ import annotations

import os
import sys


def stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that what is still buffered, and what is printed after, goes nowhere instead of
    failing again (at the interpreter's last flush too, which would print "Exception ignored" and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):  # a stdout with no file descriptor (replaced, closed): nothing to flush there
        pass


def say(text: str) -> None:
    """Print ``text`` to stdout, now; a stdout that can no longer be written (a terminal or SSH session that hung up:
    EIO, a reader gone: EPIPE) is pointed at /dev/null and the line dropped, not raised."""
    try:
        print(text, flush=True)
    except OSError:
        stdout_to_devnull()
