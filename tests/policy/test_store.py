"""PolicyStore: edits take effect without a restart; broken edits never do."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.policy import PolicyError, PolicyStore, hash_api_key
from router import TenantPolicy

KEY = hash_api_key("sk-test")


def tenant_yaml(rpm: int | str, *, tenant_id: str = "acme") -> str:
    return f'tenants:\n  - id: {tenant_id}\n    api_keys: ["{KEY}"]\n    limits: {{requests_per_minute: {rpm}}}\n'


def rpm(store: PolicyStore) -> int | None:
    return store.current().by_id["acme"].limits.requests_per_minute


def replace(path: Path, text: str) -> None:
    """Write as editors and deploy tools do (temp file, then rename), so a poll never sees a
    half-written file."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


async def eventually(condition: Callable[[], bool], within: float = 2.0) -> float:
    """Seconds until `condition()` held; fails the test after `within`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < within, "condition did not hold in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    (tmp_path / "acme.yaml").write_text(tenant_yaml(10))
    return tmp_path


async def test_an_edit_takes_effect_within_two_seconds_at_the_default_interval(policy_dir: Path) -> None:
    async with PolicyStore(policy_dir) as store:
        replace(policy_dir / "acme.yaml", tenant_yaml(20))

        await eventually(lambda: rpm(store) == 20, within=2.0)


async def test_a_broken_edit_keeps_the_last_good_set_and_reports_file_and_field(
    policy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with PolicyStore(policy_dir, interval=0.02) as store:
        with caplog.at_level(logging.ERROR, logger="gateway.policy.store"):
            replace(policy_dir / "acme.yaml", tenant_yaml('"lots"'))
            await eventually(lambda: store.last_error is not None)

        assert rpm(store) == 10
        error = store.last_error
        assert isinstance(error, PolicyError)
        assert (error.file, error.field) == (
            str(policy_dir / "acme.yaml"),
            "tenants[0].limits.requests_per_minute",
        )
        assert "tenants[0].limits.requests_per_minute" in caplog.text


async def test_fixing_a_broken_edit_clears_the_error_and_installs_the_fix(policy_dir: Path) -> None:
    async with PolicyStore(policy_dir, interval=0.02) as store:
        replace(policy_dir / "acme.yaml", "tenants: [")
        await eventually(lambda: store.last_error is not None)

        replace(policy_dir / "acme.yaml", tenant_yaml(30))

        await eventually(lambda: rpm(store) == 30)
        assert store.last_error is None


def test_reverting_a_broken_edit_clears_the_error(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir)
    store.load()
    good = (policy_dir / "acme.yaml").read_text()

    (policy_dir / "acme.yaml").write_text("tenants: [")
    store.reload()
    (policy_dir / "acme.yaml").write_text(good)
    store.reload()

    assert store.last_error is None and rpm(store) == 10


def test_a_new_file_adds_tenants_and_a_deleted_file_removes_them(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir)
    store.load()
    extra_file = policy_dir / "beta.yaml"

    extra_file.write_text(f'tenants:\n  - id: beta\n    api_keys: ["{hash_api_key("sk-beta")}"]\n')
    assert store.reload()
    assert store.authenticate("sk-beta") is not None

    extra_file.unlink()
    assert store.reload()
    assert store.authenticate("sk-beta") is None


def test_an_unchanged_directory_is_not_reparsed(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir)
    first = store.load()

    assert not store.reload()
    assert store.current() is first


def test_touching_a_file_without_changing_it_installs_nothing(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir)
    first = store.load()

    (policy_dir / "acme.yaml").write_text(tenant_yaml(10))

    assert not store.reload()
    assert store.current() is first


async def test_an_invalid_directory_at_start_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(tenant_yaml('"lots"'))

    with pytest.raises(PolicyError):
        await PolicyStore(tmp_path).start()


def test_current_before_loading_is_a_clear_error(policy_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="start"):
        PolicyStore(policy_dir).current()


async def test_extra_in_memory_policies_are_served_alongside_files(policy_dir: Path) -> None:
    demo = TenantPolicy("demo", frozenset({hash_api_key("sk-demo")}))

    async with PolicyStore(policy_dir, extra=[demo]) as store:
        assert store.authenticate("sk-demo") is demo
        assert store.authenticate("sk-test") is not None


async def test_extra_policies_alone_need_no_directory() -> None:
    demo = TenantPolicy("demo", frozenset({hash_api_key("sk-demo")}))

    async with PolicyStore(None, extra=[demo]) as store:
        assert store.authenticate("sk-demo") is demo


def test_a_file_tenant_clashing_with_an_extra_policy_is_rejected_on_reload(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir, extra=[TenantPolicy("demo", frozenset())])
    store.load()

    (policy_dir / "demo.yaml").write_text("tenants:\n  - id: demo\n    api_keys: []\n")
    store.reload()

    assert store.last_error is not None and "duplicate tenant id 'demo'" in str(store.last_error)
    assert store.current().by_id["demo"].api_key_hashes == frozenset()


async def test_stop_ends_polling(policy_dir: Path) -> None:
    store = PolicyStore(policy_dir, interval=0.01)
    await store.start()
    await store.stop()

    (policy_dir / "acme.yaml").write_text(tenant_yaml(99))
    await asyncio.sleep(0.1)

    assert rpm(store) == 10
