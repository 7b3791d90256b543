"""Entry point of ``rttsched``: parse, load settings, dispatch, and turn errors into one clear line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import stat
import sys
from collections.abc import Sequence
from typing import Any

from app import masking
from app.config import Settings
from app.errors import RttError

# subcommand -> module under app.cli; order is the order of --help
COMMANDS = (
    "broker", "topics", "bridge", "publish", "worker", "trainer", "extender", "explain", "models", "pods", "select",
    "sim", "demo", "settings",
)
# commands a person runs and reads: a progress bar and the result, warnings and errors only (``-v``: debug);
# the long-running services log at INFO
INTERACTIVE = frozenset({"topics", "publish", "select", "sim", "demo", "settings", "explain", "models"})
# the status of a command whose output's reader went away (`rttsched models list | head`): what a shell reports for
# a tool that SIGPIPE ended, 128 + 13, as `yes | head` under `set -o pipefail`
READER_GONE = 141


def _available() -> dict[str, Any]:
    mods: dict[str, Any] = {}
    for name in COMMANDS:
        try:
            mods[name] = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"app.cli.{name}":
                raise
    return mods


def _output_cut(exc: BaseException) -> bool:
    """Whether ``exc`` is stdout's reader gone: a broken pipe while stdout is a pipe (or a socket) whose reading end
    is closed; a broken pipe of a connection, while stdout's reader is still there, is an error like any other."""
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        events = poll.poll(0)  # the writing end of a pipe with no reader left: POLLERR (a socket's: POLLHUP too)
    except (OSError, ValueError):  # replaced by an object without a descriptor, or closed
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def _reader_gone() -> int:
    """stdout's reader went away: say nothing, as shell tools do, and point stdout at /dev/null so that the
    interpreter's last flush of what is still buffered does not fail again at exit."""
    from app.cli.output import to_devnull

    to_devnull()
    return READER_GONE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rttsched",
        description="RTT-aware scheduling for heterogeneous GPU/CPU clusters. Settings come from RTT_* "
        "environment variables (see `rttsched <command> --help` and the README).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (also after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, mod in _available().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)  # type: ignore[attr-defined]
        mod.add_arguments(p)  # type: ignore[attr-defined]
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet = logging.WARNING if args.command in INTERACTIVE else logging.INFO
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else quiet,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings.from_env()
        masking.install(settings.secrets())
        status = int(args._module.run(args, settings) or 0)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not in the interpreter's flush at exit
        return status
    except RttError as exc:
        print(f"rttsched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rttsched {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # last line of defence: one clear line, the traceback only with -v
        if _output_cut(exc):  # `| head`: the rest of the output is not wanted
            return _reader_gone()
        if args.verbose:
            logging.getLogger("rttsched").exception("unexpected error")
        print(f"rttsched {args.command}: error: {type(exc).__name__}: {exc} (run with -v for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
