"""The image build installs pinned versions: deploy/constraints.txt, made by deploy/pin_constraints.py.

* every package of the runtime closure of pyproject.toml's ``[project].dependencies`` is pinned with ``==``,
  at a version inside pyproject's range, and the file is what the script writes from this environment now;
* a dependency added to pyproject.toml without a pin (or a pin out of its range) is caught;
* deploy/Dockerfile passes the file to every ``pip wheel`` and ``pip install`` and puts it in the context.
"""

from __future__ import annotations

import doctest
import importlib.metadata
import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "deploy" / "pin_constraints.py"
CONSTRAINTS = REPO / "deploy" / "constraints.txt"
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pin_constraints", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pins_script = _load_script()


def _pins(text: str) -> dict[str, Version]:
    """``name==version`` lines of a constraints file; anything else but comments fails."""
    out: dict[str, Version] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and not req.marker and not req.extras and "*" not in spec.version, line
        name = canonicalize_name(req.name)
        assert name not in out, f"{name} pinned twice"
        out[name] = Version(spec.version)
    return out


def _unpinned(pyproject: Path, pins: dict[str, Version]) -> set[str]:
    """Packages of the runtime closure of ``pyproject`` that the pins do not name."""
    needed = pins_script.closure(pins_script.runtime_requirements(pyproject), pins_script.target_environment())
    return set(needed) - set(pins)


def _out_of_range(pyproject: Path, pins: dict[str, Version]) -> list[str]:
    """pyproject.toml's dependencies whose pin their specifier refuses."""
    return [str(r) for r in pins_script.runtime_requirements(pyproject)
            if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]


PINS = _pins(CONSTRAINTS.read_text())


def test_every_package_of_the_runtime_closure_is_pinned_exactly():
    assert not _unpinned(REPO / "pyproject.toml", PINS)
    # the dev extra is no part of the image
    assert "pytest" not in PINS and "mypy" not in PINS


def test_each_pin_is_inside_pyprojects_range():
    assert not _out_of_range(REPO / "pyproject.toml", PINS)


def test_the_file_is_what_the_script_writes_from_this_environment():
    """The tests run with the versions the image installs: the README's and CI's install pass the file to pip."""
    assert CONSTRAINTS.read_text() == pins_script.current_text(), (
        "deploy/constraints.txt differs from the installed versions: install with -c deploy/constraints.txt (as "
        "the README says), or, to move the pins, run python3 deploy/pin_constraints.py")


def test_the_readme_and_ci_install_the_pinned_versions():
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    installs = re.findall(r"pip install[^\n`]*", readme) + re.findall(r"pip install[^\n]*", ci)
    assert installs and all("-c deploy/constraints.txt" in line for line in installs), installs


def test_a_dependency_added_without_a_pin_is_caught(tmp_path):
    data = (REPO / "pyproject.toml").read_text()
    deps = tomllib.loads(data)["project"]["dependencies"]
    assert '"tqdm>=4.66",\n]' in data, "pyproject.toml's dependencies no longer end with tqdm: update this test"
    added = tmp_path / "pyproject.toml"
    added.write_text(data.replace('"tqdm>=4.66",\n]', '"tqdm>=4.66",\n  "pytest>=8",\n]'))
    assert len(tomllib.loads(added.read_text())["project"]["dependencies"]) == len(deps) + 1
    assert {"pytest", "pluggy", "iniconfig"} <= _unpinned(added, PINS)
    check = subprocess.run([sys.executable, str(SCRIPT), "--check", "--pyproject", str(added)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "not up to date" in check.stderr, check


def test_a_pin_outside_pyprojects_range_is_caught():
    assert _out_of_range(REPO / "pyproject.toml", {**PINS, "numpy": Version("1.25.2")}) == ["numpy>=1.26"]


def test_the_check_passes_on_the_committed_file_and_fails_on_a_stale_one(tmp_path):
    ok = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    stale = tmp_path / "constraints.txt"
    stale.write_text("".join(line for line in CONSTRAINTS.read_text().splitlines(keepends=True)
                             if not line.startswith("numpy==")))
    check = subprocess.run([sys.executable, str(SCRIPT), "--check", "--output", str(stale)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and check.stderr.count("\n") == 1, check


def test_a_missing_package_or_a_contradicting_version_is_a_one_line_error(tmp_path):
    fake = {"a": ("1.0", ["b>=2"]), "b": ("1.5", [])}

    def installed(name):
        if name not in fake:
            raise importlib.metadata.PackageNotFoundError(name)
        return fake[name]

    with pytest.raises(pins_script.PinError, match=r"^b 1.5 is installed but a 1.0 requires b>=2$"):
        pins_script.closure([Requirement("a")], {}, installed)
    with pytest.raises(pins_script.PinError, match=r"^c \(required by pyproject.toml\) is not installed"):
        pins_script.closure([Requirement("c")], {}, installed)
    missing = tmp_path / "pyproject.toml"
    missing.write_text('[project]\nname = "x"\ndependencies = ["no-such-package-rttsched-test>=1"]\n')
    run = subprocess.run([sys.executable, str(SCRIPT), "--check", "--pyproject", str(missing)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run
    assert "no-such-package-rttsched-test (required by pyproject.toml) is not installed" in run.stderr


def test_the_scripts_examples():
    assert doctest.testmod(pins_script, optionflags=doctest.ELLIPSIS).failed == 0


def test_the_pins_are_for_the_python_of_the_image():
    bases = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")]
    assert bases and all(re.match(rf"python:{re.escape(pins_script.TARGET_PYTHON)}-", b) for b in bases), bases
    assert f"CPython {pins_script.TARGET_PYTHON} on Linux" in CONSTRAINTS.read_text()


def _run_commands(dockerfile: str) -> list[list[str]]:
    """The shell commands of the RUN instructions, split at ``&&``, ``;`` and the shell's keywords."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    runs = [line.removeprefix("RUN ") for line in joined.splitlines() if line.startswith("RUN ")]
    commands = []
    for run in runs:
        for part in re.split(r"&&|;|\bthen\b|\bfi\b", run):
            words = shlex.split(part)
            if words:
                commands.append(words)
    return commands


def test_every_pip_install_of_the_image_uses_the_constraints():
    dockerfile = DOCKERFILE.read_text()
    pips = [c for c in _run_commands(dockerfile) if c[0] == "pip" and c[1] in ("wheel", "install")]
    assert [c[1] for c in pips] == ["wheel", "install", "install"], pips  # build, runtime, CUDA variant
    copied = {"deploy/constraints.txt": "/src/deploy/constraints.txt"}  # the build stage's WORKDIR is /src
    copied |= {line.split()[-1]: line.split()[-1] for line in dockerfile.splitlines()
               if line.startswith("COPY --from=build /src/deploy/constraints.txt ")}
    for cmd in pips:
        assert "-c" in cmd and cmd[cmd.index("-c") + 1] in copied, cmd
    assert re.search(r"^COPY deploy/constraints\.txt \./deploy/constraints\.txt$", dockerfile, re.M)


def test_the_build_context_carries_the_constraints():
    rules = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!deploy/constraints.txt" in rules[rules.index("*"):]
