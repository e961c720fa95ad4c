"""A node's model pool with golden probes, on the real engine in-process (issue 34): a node whose
only model is other weights under the certified golden file never becomes ready; certified
weights do; probing stays within its share of the engine's time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protocol import ServiceUnavailableError
from regional_node.probes import GOLDEN_FILE
from regional_node.probes.certify import certify
from regional_node.probes.golden import write_golden
from regional_node.server.config import ProbeSettings, ServedModelConfig
from regional_node.server.pool import ModelPool
from tests.support.checkpoints import make_checkpoint


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("pool-probes"), "llama", "tiny", num_hidden_layers=1)
    import asyncio

    write_golden(checkpoint / GOLDEN_FILE, asyncio.run(certify(checkpoint)))
    return checkpoint


async def _loaded(path: Path, max_share: float = 0.01) -> ModelPool:
    probes = ProbeSettings(interval_s=3600, max_share=max_share)
    pool = ModelPool([ServedModelConfig(name="m", path=str(path), version="v1", probes=probes)], warmup=False)
    await pool.load()
    return pool


async def test_a_corrupted_single_model_node_never_becomes_ready(certified: Path, tmp_path: Path) -> None:
    impostor = make_checkpoint(tmp_path, "llama", "tiny", num_hidden_layers=1, seed=7)
    shutil.copy(certified / GOLDEN_FILE, impostor / GOLDEN_FILE)
    pool = await _loaded(impostor)
    try:
        assert pool.state == "ready"  # loaded...
        assert not pool.ready and not pool.serving("m")  # ...but never ready for its only model
        assert pool.probe_states()["m"].status == "failed" and pool.probe_states()["m"].failures == 1
        with pytest.raises(ServiceUnavailableError) as refused:
            pool.get("m")
        assert refused.value.code == "model_probe_failed"
    finally:
        await pool.shutdown()


async def test_certified_weights_pass_and_probing_keeps_to_its_share(certified: Path) -> None:
    pool = await _loaded(certified, max_share=0.001)
    try:
        assert pool.ready and pool.serving("m") and pool.get("m").name == "m"
        state = pool.probe_states()["m"]
        assert state.status == "passed" and state.last_success is not None
        prober = pool.prober("m")
        assert prober is not None
        # The round took some time d; the next waits at least d / max_share (here 1000 d).
        assert prober.next_delay_s() >= prober.last_duration_s / 0.001 > 0
    finally:
        await pool.shutdown()


def test_a_configured_golden_file_must_exist(certified: Path, tmp_path: Path) -> None:
    from regional_node.server.config import ConfigError, convert_config, validate_config

    raw = {
        "models": [{"name": "m", "path": str(certified), "probes": {"golden": str(tmp_path / "nope.json")}}]
    }
    with pytest.raises(ConfigError, match=r"models\[0\]\.probes\.golden: .*meridian model certify"):
        validate_config(convert_config(raw, source="node.yaml"), source="node.yaml")
    with pytest.raises(ConfigError, match="max_share"):
        convert_config(
            {"models": [{"name": "m", "path": "x", "probes": {"max_share": 2}}]}, source="node.yaml"
        )
