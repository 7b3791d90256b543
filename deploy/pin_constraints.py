#!/usr/bin/env python3
"""Write deploy/constraints.txt: the exact versions of rttsched's runtime dependencies, for the image build.

The pins are the versions installed in the environment this runs in (the one the tests run with), for the
whole closure of ``[project].dependencies`` of pyproject.toml (not the ``dev`` extra): each requirement is
followed through the installed packages' own requirements, with their extras, and kept where its marker holds
for CPython 3.11 on Linux, the image's Python (deploy/Dockerfile's base image).

    python3 deploy/pin_constraints.py            # rewrite deploy/constraints.txt
    python3 deploy/pin_constraints.py --check    # exit 1 if the file is not what this would write now

Run it after ``pip install -e .`` (or after upgrading a dependency and running the tests); it refuses an
environment that misses a package of the closure or whose installed versions contradict a requirement.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
CONSTRAINTS = REPO / "deploy" / "constraints.txt"
# The Python of deploy/Dockerfile's base image (python:3.11-slim-bookworm): markers are evaluated for it.
TARGET_PYTHON = "3.11"
TARGET_PLATFORM = "Linux"
TARGET_IMPLEMENTATION = "CPython"
COMMAND = "python3 deploy/pin_constraints.py"


class PinError(Exception):
    """The environment cannot give a consistent set of pins (a package missing, a version out of range)."""


def runtime_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """The ``[project].dependencies`` of a pyproject.toml, parsed."""
    try:
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise PinError(f"{pyproject}: no readable [project].dependencies ({exc})") from None
    try:
        return [Requirement(d) for d in deps]
    except InvalidRequirement as exc:
        raise PinError(f"{pyproject}: [project].dependencies: {exc}") from None


def target_environment() -> dict[str, str]:
    """The marker environment of this interpreter, which must be the image's: CPython 3.11 on Linux."""
    found = (platform.python_implementation(), ".".join(platform.python_version_tuple()[:2]), platform.system())
    if found != (TARGET_IMPLEMENTATION, TARGET_PYTHON, TARGET_PLATFORM):
        raise PinError(f"the pins are taken from a {TARGET_IMPLEMENTATION} {TARGET_PYTHON} environment on "
                       f"{TARGET_PLATFORM} (the image's Python), not from {' '.join(found)}")
    return {key: str(value) for key, value in default_environment().items()}


def _installed(name: str) -> tuple[str, list[str]]:
    dist = importlib.metadata.distribution(name)
    return dist.version, list(dist.requires or [])


def closure(requirements: Iterable[Requirement], environment: dict[str, str],
            installed: Callable[[str], tuple[str, list[str]]] = _installed) -> dict[NormalizedName, str]:
    """Every package the requirements need in ``environment``, with its installed version.

    ``installed(name)`` gives a package's version and requirement strings (importlib.metadata by default);
    a requirement's marker is evaluated with each extra asked of its package (and with none).

    >>> fake = {"a": ("1.0", ["b[x]>=2", "c; sys_platform == 'win32'"]), "b": ("2.1", ["d; extra == 'x'"]),
    ...         "c": ("1", []), "d": ("0.5", [])}
    >>> closure([Requirement("a")], {"sys_platform": "linux"}, lambda n: fake[n])
    {'a': '1.0', 'b': '2.1', 'd': '0.5'}
    >>> closure([Requirement("c; sys_platform == 'win32'")], {"sys_platform": "linux"}, lambda n: fake[n])
    {}
    """
    pins: dict[NormalizedName, str] = {}
    extras_done: dict[NormalizedName, set[str]] = {}  # "" stands for the package without extras
    todo: list[tuple[Requirement, str]] = [(r, "pyproject.toml") for r in requirements
                                           if r.marker is None or r.marker.evaluate({**environment, "extra": ""})]
    while todo:
        req, wanted_by = todo.pop()
        name = canonicalize_name(req.name)
        if name not in pins:
            try:
                version, requires = installed(req.name)
            except importlib.metadata.PackageNotFoundError:
                raise PinError(f"{req.name} (required by {wanted_by}) is not installed: pip install -e . "
                               "first") from None
            pins[name] = version
            extras_done[name] = set()
            new_extras = {"", *(str(canonicalize_name(e)) for e in req.extras)}
        else:
            version, requires = installed(req.name)
            new_extras = {str(canonicalize_name(e)) for e in req.extras} - extras_done[name]
        if not req.specifier.contains(Version(version), prereleases=True):
            raise PinError(f"{req.name} {version} is installed but {wanted_by} requires {req}")
        extras_done[name] |= new_extras
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None and "" in new_extras:
                todo.append((sub, f"{name} {version}"))
            elif sub.marker is not None and any(sub.marker.evaluate({**environment, "extra": e})
                                                for e in new_extras):
                todo.append((sub, f"{name} {version}"))
    return dict(sorted(pins.items()))


def render(pins: dict[NormalizedName, str]) -> str:
    """The constraints file: a header that says how it was made, then one ``name==version`` a line, sorted."""
    header = [
        "# Exact versions of rttsched's runtime dependencies (the closure of [project].dependencies of",
        "# pyproject.toml, not the dev extra) for the image build: deploy/Dockerfile passes this file to",
        "# `pip wheel -c` and `pip install -c`, so two builds of one tag install the same packages.",
        f"# Made by `{COMMAND}` from the environment the tests run with, for",
        f"# {TARGET_IMPLEMENTATION} {TARGET_PYTHON} on {TARGET_PLATFORM} (markers evaluated for it). "
        "Do not edit: rerun the script.",
    ]
    return "\n".join(header + [f"{name}=={version}" for name, version in sorted(pins.items())]) + "\n"


def current_text(pyproject: Path = PYPROJECT) -> str:
    """What the script writes now, from this environment."""
    return render(closure(runtime_requirements(pyproject), target_environment()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pin_constraints.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--output", type=Path, default=CONSTRAINTS, help="the constraints file (%(default)s)")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT, help="whose dependencies (%(default)s)")
    args = parser.parse_args(argv)
    try:
        text = current_text(args.pyproject)
    except PinError as exc:
        print(f"pin_constraints: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        try:
            same = args.output.read_text() == text
        except OSError:
            same = False
        if not same:
            print(f"pin_constraints: {args.output} is not up to date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    try:
        args.output.write_text(text)
    except OSError as exc:
        print(f"pin_constraints: error: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"{args.output}: {text.count('==')} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
