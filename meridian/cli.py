"""The `meridian` command.

    meridian up [--port 8080]             local federation: gateway + one node per region
    meridian gateway --config FILE        the gateway alone [--workers N: N processes, one port]
    meridian node ...                     a regional node (regional_node/cli.py)
    meridian model init OUT_DIR ...       a random local checkpoint (regional_node/checkpoints)
    meridian policy hash-key KEY          the sha256:... form of an API key, for policy files
    meridian policy check [DIR]           validate a policy folder
    meridian ledger --config FILE         the external ledger worker (usage streams -> ledger store)
    meridian usage export --config FILE --from DATE --to DATE [--tenant T] --format csv|jsonl
    meridian escalation calibrate ...     pick an `auto` escalation threshold for a model pair

`node` and `model` import their packages only when chosen: the gateway never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from litestar import Litestar

logger = logging.getLogger("meridian.gateway")


def _configure_gateway_logging() -> None:
    from gateway.safety.logs import install_redaction

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_redaction()  # no key or personal data a client sent reaches a log line
    # One line per probe and per proxied request would drown everything else.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _worker_app(config_path: str) -> Litestar:
    """One `--workers` process's app, built in that process from the config the parent checked."""
    from gateway.app import create_app
    from gateway.config import load_config

    _configure_gateway_logging()
    return create_app(load_config(config_path))


def _gateway_main(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.config import ConfigError, load_config
    from gateway.policy import PolicyError
    from gateway.runtime.serve import run_gateway
    from gateway.runtime.workers import run_workers
    from gateway.upstreams.providers import ProviderConfigError

    _configure_gateway_logging()
    if args.workers < 1:
        print("meridian gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
        # Built here even with --workers, where each worker builds its own: a bad policy or
        # provider entry then stops start-up once, with its file and field named.
        app = create_app(config)
    except (ConfigError, PolicyError, ProviderConfigError) as exc:
        print(f"meridian gateway: {exc}", file=sys.stderr)
        return 2
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    admin = (config.admin.host, args.admin_port if args.admin_port is not None else config.admin.port)
    if args.workers == 1:
        return run_gateway(app, host, port, admin)
    del app
    if config.quota.redis_url is None:
        logger.warning(
            "--workers %d with the in-process quota store: each worker keeps its own counters, so a "
            "tenant may get up to %d times its limits; set quota.redis_url for exact quotas",
            args.workers,
            args.workers,
        )
    return run_workers(
        functools.partial(_worker_app, str(args.config)), host, port, args.workers, admin=admin
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meridian", description="Meridian: a federated LLM gateway.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = commands.add_parser("up", help="run a local federation: gateway + nodes in two jurisdictions")
    from meridian.federation.options import add_up_arguments

    add_up_arguments(up)
    gateway = commands.add_parser("gateway", help="run the gateway from a config file")
    gateway.add_argument("--config", required=True, help="gateway YAML config (see gateway/README.md)")
    gateway.add_argument("--host", help="listen address (default: the config's listen.host)")
    gateway.add_argument("--port", type=int, help="listen port (default: the config's listen.port)")
    gateway.add_argument(
        "--admin-port",
        type=int,
        help="the admin listener's port, serving /metrics (default: the config's admin.port)",
    )
    gateway.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes sharing the port (SO_REUSEPORT; default 1). With more than one, "
        "exact quotas need quota.redis_url: the in-process store counts per worker",
    )
    ledger = commands.add_parser(
        "ledger", help="run the ledger worker: usage streams in Redis -> ledger store"
    )
    ledger.add_argument(
        "--config", required=True, help="the gateway YAML config (quota.redis_url, ledger.store)"
    )
    usage = commands.add_parser("usage", help="usage ledger tools: export")
    usage_commands = usage.add_subparsers(dest="usage_command", required=True, metavar="SUBCOMMAND")
    export = usage_commands.add_parser("export", help="write raw usage events of [--from, --to) for billing")
    export.add_argument("--config", required=True, help="the gateway YAML config (its ledger.store)")
    export.add_argument(
        "--from", dest="start", required=True, help="YYYY-MM-DD (UTC), ISO 8601 time or Unix s"
    )
    export.add_argument("--to", dest="end", required=True, help="exclusive; same forms as --from")
    export.add_argument("--tenant", help="one tenant (default: all)")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument("--output", "-o", help="file to write (default: stdout)")
    commands.add_parser("node", help="run a regional node (meridian node --help)", add_help=False)
    commands.add_parser("model", help="manage local checkpoints (meridian model init --help)", add_help=False)
    commands.add_parser("policy", help="policy tools: hash-key KEY, check [DIR]", add_help=False)
    commands.add_parser("safety", help="safety tools: init-model PATH, audit FILE", add_help=False)
    commands.add_parser(
        "escalation",
        help="`auto` escalation tools: calibrate (meridian escalation calibrate --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A crash in native code (or a SIGABRT sent to a hung process) prints every thread's Python
    # stack to stderr, where the service's logs go. A stderr with no file behind it (captured,
    # embedded) has nowhere to dump to.
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.enable()
    # Pass-through commands own their flags, so they are dispatched before argparse sees them.
    if argv and argv[0] == "node":
        from regional_node.cli import node_main

        return node_main(argv[1:])
    if argv and argv[0] == "model":
        from regional_node.checkpoints.cli import model_init_main

        return model_init_main(argv[1:])
    if argv and argv[0] == "policy":
        from gateway.policy.__main__ import main as policy_main

        return policy_main(argv[1:])
    if argv and argv[0] == "safety":
        from gateway.safety.__main__ import main as safety_main

        return safety_main(argv[1:])
    if argv and argv[0] == "escalation":
        from meridian.escalation.cli import escalation_main

        return escalation_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "gateway":
        return _gateway_main(args)
    if args.command == "ledger":
        from gateway.ledger.commands import ledger_main

        _configure_gateway_logging()
        return ledger_main(args.config)
    if args.command == "usage":
        from gateway.ledger.commands import export_main

        return export_main(args.config, args.start, args.end, args.tenant, args.format, args.output)
    from meridian.federation.up import up_main

    return up_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
