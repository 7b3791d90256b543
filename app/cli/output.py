"""What the commands print: aligned tables, names from files or servers made safe for a terminal, and writing to a
stdout that may be gone (a reader that went away, ``| head``; a terminal that hung up)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO


def to_devnull(stream: TextIO | None = None) -> None:
    """Point ``stream``'s descriptor (stdout by default) at /dev/null, so that what is still buffered, and what is
    printed after, goes nowhere instead of failing again (at the interpreter's last flush too, which would print
    "Exception ignored" and exit 120)."""
    try:
        fd = (stream or sys.stdout).fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    except (OSError, ValueError):  # a stream with no file descriptor (replaced, closed): nothing to flush there
        pass


def say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` to ``stream`` (stdout by default), now; one that can no longer be written (a terminal or SSH
    session that hung up: EIO, a reader gone: EPIPE) is pointed at /dev/null and the line dropped, not raised."""
    out = stream or sys.stdout
    try:
        print(text, file=out, flush=True)
    except OSError:
        to_devnull(out)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns (those in ``right`` aligned right), two spaces apart.

    >>> for line in table(("KEY", "V"), [("gCTF:gpu", "v12")], right=frozenset({1})): print(line)
    KEY       V
    gCTF:gpu  v12
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(head), *(line(r) for r in rows)]


def printable(text: str) -> str:
    """``text`` as a terminal may show it: each character that is not printable (a control character such as
    ESC or a line break, a bidirectional override) written as its Python escape, so that a name read from a
    file or a server can neither recolour, move or clear the screen nor hide what follows it.

    >>> printable("gCTF"), printable("a\\x1b[2Jb"), printable("x\\r\\n"), printable("üb\\u202eer")
    ('gCTF', 'a\\\\x1b[2Jb', 'x\\\\r\\\\n', 'üb\\\\u202eer')
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
