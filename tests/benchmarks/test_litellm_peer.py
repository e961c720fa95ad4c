"""The LiteLLM peer of the three-way benchmark is the release the goals are stated against: a venv
holding another release is refused in words, never measured as if it were that one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def litellm_proxy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from gateway_bench import litellm_proxy

    return litellm_proxy


def fake_venv(root: Path, version: str) -> Path:
    """A venv whose interpreter reports `version` for litellm, and has a `litellm` command."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\necho {version}\n")
    (bin_dir / "litellm").write_text("#!/bin/sh\nexit 0\n")
    for script in (python, bin_dir / "litellm"):
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return root


def test_a_venv_of_the_pinned_release_is_reused(litellm_proxy, tmp_path: Path) -> None:
    version = litellm_proxy.LITELLM_VERSION
    venv = fake_venv(tmp_path / "venv", version)
    command = litellm_proxy.ensure_litellm(venv, version, tmp_path / "install.log")
    assert command == venv / "bin" / "litellm"
    assert not (tmp_path / "install.log").exists()  # nothing was installed


def test_a_venv_of_another_release_is_refused(litellm_proxy, tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", "1.108.7")
    with pytest.raises(RuntimeError, match=r"holds litellm 1\.108\.7, not 1\.106\.2"):
        litellm_proxy.ensure_litellm(venv, "1.106.2", tmp_path / "install.log")


def test_each_release_gets_its_own_default_venv(litellm_proxy) -> None:
    assert litellm_proxy.default_venv("1.106.2") != litellm_proxy.default_venv("1.108.7")
    assert litellm_proxy.LITELLM_VERSION == "1.106.2"  # issue 31's peer
