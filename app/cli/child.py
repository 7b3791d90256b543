"""``python -m app.cli.child COMMAND ...``: ``rttsched COMMAND`` as a child of the demo's
:class:`~app.cli.processes.ProcessGroup`, which cannot outlive its parent for long.

The group starts each child with the Linux death signal (SIGTERM when the parent dies, even by SIGKILL:
:func:`app.kafka.embedded.die_with_parent`) and names the parent here (:data:`PARENT_ENV`, ``"<pid> <seconds>"``).
Nothing follows that signal: a child whose stop hangs, or that ignores it, would run on under PID 1. So this entry
point watches the parent first (:func:`app.kafka.embedded.exit_with_parent`): once it is gone, the child has the
given seconds to stop, then it and its process group are killed. The variable is taken out of the environment, so
what the command starts in turn does not inherit it.
"""

from __future__ import annotations

import os
import sys

PARENT_ENV = "RTTSCHED_DIE_WITH_PARENT"


def watch_parent(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Arm the watch the group asked for in ``environ`` (and take the variable out); whether it did.

    >>> watch_parent({"RTTSCHED_DIE_WITH_PARENT": "not a pid"}), watch_parent({})
    (False, False)
    """
    raw = environ.pop(PARENT_ENV, None)
    try:
        pid, stop_s = raw.split() if raw else ("", "")
        parent, seconds = int(pid), float(stop_s)
    except ValueError:
        return False
    from app.kafka.embedded import exit_with_parent

    exit_with_parent(parent, seconds)
    return True


def main() -> int:
    watch_parent()
    from app.cli.main import main as command

    return command()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
