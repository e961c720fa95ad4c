"""Node configuration: YAML and flags validated at start-up, errors naming the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.cli import build_parser, config_from_args, node_main, parse_model_flag
from regional_node.cpu_share import available_cpus
from regional_node.server import ConfigError, load_config, validate_config
from regional_node.server.config import CpuSettings


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_config_loads_with_defaults_and_relative_paths(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "node_id: n1\nregion: eu-west\njurisdiction: eu\nmodels:\n  - name: small\n    path: ckpt\n"
        "    engine: {num_kv_blocks: 32, options: {max_model_len: 512}}\n",
    )
    config = load_config(path)
    model = config.models[0]
    assert (config.node_id, config.region, config.jurisdiction, config.port) == ("n1", "eu-west", "eu", 8100)
    assert model.path == str(tmp_path / "ckpt") and model.tier == "small"
    kwargs = model.engine.engine_kwargs()
    assert kwargs["num_kv_blocks"] == 32 and kwargs["max_model_len"] == 512 and kwargs["device"] == "cpu"
    assert "options" not in kwargs


def test_queue_bounds_default_to_engine_steps_and_null_means_unbounded(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "models:\n"
        "  - {name: a, path: a, engine: {max_num_batched_tokens: 512}}\n"
        "  - {name: b, path: b, queue: {interactive_max_waiting_tokens: 1000, batch_max_waiting_tokens: null,"
        " batch_max_wait_s: 30}}\n",
    )
    defaults, custom = load_config(path).models
    # Defaults: a few engine steps' worth of prompt tokens for interactive, many for batch.
    assert defaults.queue_bounds() == {"interactive": 4 * 512, "batch": 64 * 512}
    assert defaults.queue.max_wait_s() == {} and defaults.queue.max_retry_after_s == 60
    assert custom.queue_bounds() == {"interactive": 1000}
    assert custom.queue.max_wait_s() == {"batch": 30.0}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("models:\n  - name: m\n    path: p\n    tier: huge\n", "models[0].tier"),
        (
            "models:\n  - name: m\n    path: p\n    engine: {block_size: zero}\n",
            "models[0].engine.block_size",
        ),
        ("models:\n  - name: m\n    path: p\n    engine: {block_size: 0}\n", "models[0].engine.block_size"),
        ("models:\n  - path: p\n", "models[0]"),
        (
            "models:\n  - name: m\n    path: p\n    queue: {batch_max_waiting_tokens: 0}\n",
            "models[0].queue.batch_max_waiting_tokens",
        ),
        (
            "models:\n  - name: m\n    path: p\n    queue: {interactive_max_wait_s: -1}\n",
            "models[0].queue.interactive_max_wait_s",
        ),
        (
            "models:\n  - name: m\n    path: p\n    queue: {max_tokens: 5}\n",
            "models[0].queue: Object contains unknown field `max_tokens`",
        ),
        ("port: 99999\n", "port"),
        ("listen_port: 1\n", "listen_port"),
        ("cpu: {engine_cpus: 'first two'}\n", "cpu.engine_cpus"),
        ("cpu: {engine_threads: 0}\n", "cpu.engine_threads"),
        ("cpu: {engine_nice: 20}\n", "cpu.engine_nice"),
    ],
    ids=[
        "bad_tier",
        "wrong_type",
        "out_of_range",
        "missing_name",
        "zero_queue_bound",
        "negative_wait",
        "unknown_queue_field",
        "bad_port",
        "unknown_field",
        "bad_cpu_list",
        "zero_threads",
        "nice_past_19",
    ],
)
def test_invalid_yaml_names_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and field in message


def test_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_validation_needs_models_unique_names_and_checkpoints(tmp_path: Path, llama_checkpoint: Path) -> None:
    empty = load_config(_write(tmp_path, "region: x\n"))
    with pytest.raises(ConfigError, match="no models configured"):
        validate_config(empty, source="node.yaml")
    dup = _write(
        tmp_path,
        f"models:\n  - {{name: a, path: {llama_checkpoint}}}\n  - {{name: a, path: {llama_checkpoint}}}\n",
    )
    with pytest.raises(ConfigError, match=r"models\[1\].name: duplicate"):
        validate_config(load_config(dup), source="node.yaml")
    missing = _write(tmp_path, "models:\n  - {name: a, path: /no/such/folder}\n")
    with pytest.raises(ConfigError, match=r"models\[0\].path"):
        validate_config(load_config(missing), source="node.yaml")


@pytest.mark.parametrize(
    ("cores", "engine_cpus", "threads"),
    [({0}, {0}, 1), ({0, 1}, {0}, 1), ({0, 1, 2, 3}, {0, 1, 2}, 3), ({2, 5, 7}, {2, 5}, 2)],
)
def test_the_engines_default_share_leaves_the_last_core_to_the_api(
    cores: set[int], engine_cpus: set[int], threads: int
) -> None:
    share = CpuSettings().share(frozenset(cores))
    assert (share.cpus, share.threads, share.nice) == (engine_cpus, threads, 10)
    # OMP_NUM_THREADS caps the default thread count, not the cores.
    capped = CpuSettings().share(frozenset(cores), max_threads=1)
    assert (capped.cpus, capped.threads) == (engine_cpus, 1)


def test_an_engine_share_names_its_cores_threads_and_niceness(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "cpu: {engine_cpus: '0-2,5', engine_threads: 2, engine_nice: 5}\n"))
    share = config.cpu.share(frozenset(range(8)))
    assert (share.cpus, share.threads, share.nice) == ({0, 1, 2, 5}, 2, 5)


def test_cpu_null_leaves_the_engines_unconfined(tmp_path: Path, llama_checkpoint: Path) -> None:
    config = load_config(_write(tmp_path, f"models:\n  - {{name: a, path: {llama_checkpoint}}}\ncpu: null\n"))
    assert validate_config(config, source="node.yaml").cpu is None


def test_validation_needs_engine_cores_this_process_may_use(tmp_path: Path, llama_checkpoint: Path) -> None:
    models = f"models:\n  - {{name: a, path: {llama_checkpoint}}}\n"
    beyond = max(available_cpus()) + 1
    outside = load_config(_write(tmp_path, models + f"cpu: {{engine_cpus: '0,{beyond}'}}\n"))
    with pytest.raises(ConfigError, match=rf"cpu.engine_cpus: core\(s\) {beyond} are not available"):
        validate_config(outside, source="node.yaml")
    crowded = load_config(_write(tmp_path, models + "cpu: {engine_cpus: '0', engine_threads: 2}\n"))
    with pytest.raises(ConfigError, match=r"cpu\.engine_threads: 2 threads on 1 engine core"):
        validate_config(crowded, source="node.yaml")


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("small=/ckpt/a", {"name": "small", "path": "/ckpt/a", "tier": "small"}),
        ("big=/ckpt/b:large", {"name": "big", "path": "/ckpt/b", "tier": "large"}),
        ("/ckpt/named", {"name": "named", "path": "/ckpt/named", "tier": "small"}),
        ("c=/odd:path", {"name": "c", "path": "/odd:path", "tier": "small"}),
    ],
)
def test_model_flag_parses_name_path_tier(flag: str, expected: dict[str, str]) -> None:
    assert parse_model_flag(flag) == expected


def test_flags_override_the_file_and_apply_engine_settings(tmp_path: Path, llama_checkpoint: Path) -> None:
    path = _write(
        tmp_path,
        f"region: us-east\nport: 9000\nmodels:\n  - {{name: a, path: {llama_checkpoint}, "
        "queue: {batch_max_waiting_tokens: 500}}\n",
    )
    args = build_parser().parse_args(
        [
            "--config",
            str(path),
            "--port",
            "9100",
            "--jurisdiction",
            "us",
            "--num-kv-blocks",
            "40",
            "--no-prefix-caching",
            "--interactive-max-wait-s",
            "0.15",
            "--engine-cpus",
            "0",
            "--engine-nice",
            "3",
        ]
    )
    config = config_from_args(args)
    assert (config.region, config.port, config.jurisdiction) == ("us-east", 9100, "us")
    assert config.models[0].engine.num_kv_blocks == 40
    assert config.models[0].engine.enable_prefix_caching is False
    # The wait limit joins the file's queue bounds instead of replacing them.
    queue = config.models[0].queue
    assert (queue.interactive_max_wait_s, queue.batch_max_wait_s) == (0.15, None)
    assert queue.batch_max_waiting_tokens == 500
    assert (config.cpu.engine_cpus, config.cpu.engine_threads, config.cpu.engine_nice) == ("0", None, 3)


def test_cli_reports_config_errors_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_main(["--model", "x=/no/such/checkpoint"]) == 2
    assert "models[0].path" in capsys.readouterr().err


def test_node_token_from_a_secret_file_ignores_its_trailing_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    from regional_node.server.config import TOKEN_ENV, NodeConfig, effective_token

    monkeypatch.setenv(TOKEN_ENV, "s3cret\n")
    assert effective_token(NodeConfig()) == "s3cret"
    monkeypatch.setenv(TOKEN_ENV, "  \n")
    assert effective_token(NodeConfig()) is None
