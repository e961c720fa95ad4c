"""`constraints.txt` pins the whole venv `make test` builds: a dependency added to pyproject.toml
without its pin would install its newest release on every clean clone, and the suite that passed
yesterday could fail tomorrow (as msgspec 0.23 once did). This test fails until the pin is added."""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig

from tests.support.processes import REPO_ROOT

# pip and setuptools come with the venv (pip freeze leaves them out); meridian is this repository.
NOT_PINNED = {"pip", "setuptools", "meridian"}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normalized form


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_name(name)] = version.strip()
    return pins


def test_every_installed_package_is_pinned_at_its_installed_version() -> None:
    pins = _pins()
    unpinned, moved = [], []
    # The venv's own site-packages only: importing setuptools puts its vendored packages (with
    # their metadata) on sys.path, which pip never installed.
    installed_here = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=installed_here):
        name = _name(dist.metadata["Name"])
        if name in NOT_PINNED:
            continue
        installed = dist.version.split("+")[0]  # torch's `+cpu` is the wheel's local label
        if name not in pins:
            unpinned.append(f"{name}=={installed}")
        elif pins[name] != installed:
            moved.append(f"{name}: installed {installed}, pinned {pins[name]}")
    assert not unpinned, f"add to constraints.txt (its header says how): {unpinned}"
    assert not moved, f"the venv and constraints.txt disagree: {moved}"
