"""Entry point of ``rttsched``: parse, load settings, dispatch, and turn errors into one clear line."""

from __future__ import annotations

import argparse
import importlib
import logging
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


def _available() -> dict[str, Any]:
    mods: dict[str, Any] = {}
    for name in COMMANDS:
        try:
            mods[name] = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"app.cli.{name}":
                raise
    return mods


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
        return int(args._module.run(args, settings) or 0)
    except RttError as exc:
        print(f"rttsched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rttsched {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # last line of defence: one clear line, the traceback only with -v
        if args.verbose:
            logging.getLogger("rttsched").exception("unexpected error")
        print(f"rttsched {args.command}: error: {type(exc).__name__}: {exc} (run with -v for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
