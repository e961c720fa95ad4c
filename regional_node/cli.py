"""`meridian node` / `python -m regional_node node`: run one regional node under uvicorn.

Settings come from `--config FILE` (YAML, see regional_node/server/README.md), then flags, which
win. uvicorn handles SIGTERM/SIGINT: it stops accepting, gives open streams a few seconds, then
runs the app's shutdown hook, which stops every engine.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from regional_node.server.config import (
    ConfigError,
    EngineSettings,
    NodeConfig,
    convert_config,
    load_config,
    validate_config,
)

# Seconds that open streams get to finish after SIGTERM before they are cut (with the engine).
GRACEFUL_SHUTDOWN_S = 3
_TIERS = ("small", "large")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meridian node",
        description="Run a Meridian regional node (OpenAI-compatible API over the engine).",
    )
    parser.add_argument("--config", type=Path, help="YAML node config; flags below override its fields")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 8100; 0 picks a free one)")
    parser.add_argument("--node-id", help="this node's id in /load and discovery")
    parser.add_argument("--region", help="region name, e.g. us-east")
    parser.add_argument("--jurisdiction", help="data jurisdiction, e.g. us or eu")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH[:TIER]",
        help="a model to serve (repeatable; replaces the config's models). TIER is small (default) or large",
    )
    parser.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug", "trace"])
    parser.add_argument(
        "--engine",
        choices=["meridian", "vllm"],
        help="meridian (default): our engine; vllm: vLLM's own engine behind the same API (needs vLLM)",
    )
    engine = parser.add_argument_group("engine settings (applied to every model)")
    engine.add_argument("--device", help="cpu, cuda, cuda:1, ...")
    engine.add_argument("--dtype", help="float32, bfloat16, float16 or auto")
    engine.add_argument("--block-size", type=int)
    engine.add_argument("--num-kv-blocks", type=int)
    engine.add_argument("--max-num-seqs", type=int)
    engine.add_argument("--max-num-batched-tokens", type=int)
    engine.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    engine.add_argument(
        "--attention-backend",
        choices=["auto", "torch", "triton", "vllm"],
        help="our engine's attention kernels (auto: the fastest installed; see regional_node/engine/README.md)",
    )
    queue = parser.add_argument_group("queue bounds (applied to every model; see the `queue` config)")
    for tier in ("interactive", "batch"):
        queue.add_argument(
            f"--{tier}-max-wait-s",
            type=float,
            help=f"refuse a {tier} request whose estimated time to first token is past this (503)",
        )
    cpu = parser.add_argument_group("the engines' share of the machine (see the `cpu` config)")
    cpu.add_argument(
        "--engine-cpus",
        metavar="LIST",
        help="cores the engines may run on, e.g. 0-2,5 (default: every core but the last)",
    )
    cpu.add_argument(
        "--engine-threads", type=int, help="compute threads per engine (default: one per engine core)"
    )
    cpu.add_argument(
        "--engine-nice", type=int, help="levels nicer than the node the engines run, 0-19 (default 10)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="mark ready without a warm-up generation")
    return parser


def parse_model_flag(value: str) -> dict[str, Any]:
    """`NAME=PATH[:TIER]` (or just `PATH`, named after its folder) as a models[] entry."""
    name, sep, rest = value.partition("=")
    if not sep:
        name, rest = "", value
    path, colon, tier = rest.rpartition(":")
    if not colon or tier not in _TIERS:
        path, tier = rest, "small"
    if not path:
        raise ConfigError(f"--model {value!r}: expected NAME=PATH[:TIER]")
    return {"name": name or Path(path).name, "path": str(Path(path).expanduser()), "tier": tier}


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    """The file's config with the flags laid over it, validated."""
    config = load_config(args.config) if args.config else NodeConfig()
    raw: dict[str, Any] = msgspec.to_builtins(config)
    for flag, field in (
        ("host", "host"),
        ("port", "port"),
        ("node_id", "node_id"),
        ("region", "region"),
        ("jurisdiction", "jurisdiction"),
        ("log_level", "log_level"),
        ("engine", "engine"),
    ):
        value = getattr(args, flag)
        if value is not None:
            raw[field] = value
    if args.no_warmup:
        raw["warmup"] = False
    cpu_flags = {
        key: getattr(args, key)
        for key in ("engine_cpus", "engine_threads", "engine_nice")
        if getattr(args, key) is not None
    }
    if cpu_flags:
        raw["cpu"] = {**(raw.get("cpu") or {}), **cpu_flags}
    if args.model:
        raw["models"] = [parse_model_flag(value) for value in args.model]
    engine_flags = {
        key: getattr(args, key)
        for key in (
            "device",
            "dtype",
            "block_size",
            "num_kv_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
        )
        if getattr(args, key) is not None
    }
    if args.no_prefix_caching:
        engine_flags["enable_prefix_caching"] = False
    queue_flags = {
        key: getattr(args, key)
        for key in ("interactive_max_wait_s", "batch_max_wait_s")
        if getattr(args, key) is not None
    }
    for model in raw.get("models", []):
        model["engine"] = {**model.get("engine", msgspec.to_builtins(EngineSettings())), **engine_flags}
        model["queue"] = {**model.get("queue", {}), **queue_flags}
        if args.attention_backend is not None:
            options = model["engine"].get("options") or {}
            model["engine"]["options"] = {**options, "attention_backend": args.attention_backend}
    source = f"{args.config} (with flags)" if args.config else "command line"
    return validate_config(convert_config(raw, source=source), source=source)


def node_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"meridian node: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def server_settings(app: Any, config: NodeConfig) -> Any:
    """The uvicorn config the node's `app` runs under: the config's address and `server` limits,
    and a client that leaves cancels its request, which aborts its engine request at once
    (server/serving.py)."""
    from http_server import server_config

    return server_config(
        app,
        config.host,
        config.port,
        config.server,
        cancel_on_disconnect=True,
        lifespan="on",
        log_level=config.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        access_log=config.log_level in ("debug", "trace"),
    )


def serve(config: NodeConfig) -> int:
    """Run the node until SIGTERM/SIGINT; 0 on a clean stop, 1 if the server could not start."""
    import uvicorn

    from regional_node.server.app import create_app

    logging.basicConfig(
        level=logging.DEBUG if config.log_level == "trace" else config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    describe = ", ".join(f"{m.name}={m.path} ({m.tier})" for m in config.models)
    logging.getLogger("regional_node").info(
        "node %s (%s/%s) on %s:%d serving %s",
        config.node_id,
        config.region,
        config.jurisdiction,
        config.host,
        config.port,
        describe,
    )

    class NodeServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            # uvicorn re-raises a captured SIGTERM/SIGINT after its graceful shutdown, which makes
            # the exit status "killed by signal"; a node that stopped cleanly exits 0 instead.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    server = NodeServer(server_settings(create_app(config), config))
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits on a port it cannot bind
        return int(exc.code or 1) if not isinstance(exc.code, str) else 1
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m regional_node node ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "node":
        print(
            "usage: python -m regional_node node [--config FILE] [--model NAME=PATH[:TIER]] ...",
            file=sys.stderr,
        )
        return 2
    return node_main(argv[1:])
