"""The shipped scenarios: the YAML files in ``scenarios/`` at the repository root (beside the ``app`` package),
found by name. ``rttsched sim --scenario`` and the benchmarks (``bench/``) take a name or a file's path.

>>> scenario_path("default") == SCENARIO_DIR / "default.yaml"
True
>>> shipped()[:2]
['default', 'bursty']
>>> scenario_path("nope")
Traceback (most recent call last):
...
ValueError: no such scenario 'nope' (shipped: default, bursty, ...)
>>> scenario_path("/nope.yaml")  # a path (a '/' in it, or a scenario file's suffix) is a file or nothing
Traceback (most recent call last):
...
ValueError: no such file /nope.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
# the order a listing shows them in (benchmarks run them in it); any other file comes after, by name
ORDER = ("default", "bursty", "saturated", "closed-loop", "degrade", "join", "large")


def shipped() -> list[str]:
    """The names of the scenarios in :data:`SCENARIO_DIR`, in :data:`ORDER` first."""
    names = (p.stem for p in SCENARIO_DIR.glob("*.yaml"))
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


SUFFIXES = (".yaml", ".yml", ".json")  # JSON is YAML too


def _no_file(name: str) -> NoReturn:
    """ValueError saying why ``name``, a scenario file's path, is none.

    >>> _no_file("/nope.yaml")
    Traceback (most recent call last):
    ...
    ValueError: no such file /nope.yaml
    """
    path = Path(name)
    if path.is_dir():
        raise ValueError(f"{name} is a directory, not a scenario file")
    if path.exists():
        raise ValueError(f"{name} is not a regular file")
    raise ValueError(f"no such file {name}")


def scenario_path(name: str) -> Path:
    """A scenario by its name in ``scenarios/`` or by the path of a ``.yaml``/``.yml``/``.json`` file; ValueError
    (naming the shipped ones) when there is none, or saying the suffix of a file that has another."""
    path = Path(name) if name.endswith(SUFFIXES) else SCENARIO_DIR / f"{name}.yaml"
    given = Path(name)
    if not path.is_file() and (given.suffix or "/" in name) and given.is_file():  # a path, not a shipped name
        raise ValueError(f"{name}: a scenario file ends in {', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]}")
    if not path.is_file() and (name.endswith(SUFFIXES) or "/" in name):  # a path: no shipped name has either
        _no_file(name)
    if not path.is_file():
        names = shipped()
        have = f"shipped: {', '.join(names)}" if names else f"none shipped: no scenarios in {SCENARIO_DIR}"
        raise ValueError(f"no such scenario {name!r} ({have})")
    return path
