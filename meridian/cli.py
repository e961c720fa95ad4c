"""The `meridian` command.

    meridian up [--port 8080]             local federation: gateway + one node per region
    meridian gateway --config FILE        the gateway alone
    meridian node ...                     a regional node (regional_node/cli.py)
    meridian model init OUT_DIR ...       a random local checkpoint (regional_node/checkpoints)
    meridian policy hash-key KEY          the sha256:... form of an API key, for policy files
    meridian policy check [DIR]           validate a policy folder

`node` and `model` import their packages only when chosen: the gateway never imports torch.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _gateway_main(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.config import ConfigError, load_config
    from gateway.policy import PolicyError
    from gateway.runtime.serve import run_gateway
    from gateway.upstreams.providers import ProviderConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per probe and per proxied request would drown everything else.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
        app = create_app(config)
    except (ConfigError, PolicyError, ProviderConfigError) as exc:
        print(f"meridian gateway: {exc}", file=sys.stderr)
        return 2
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    return run_gateway(app, host, port)


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
    commands.add_parser("node", help="run a regional node (meridian node --help)", add_help=False)
    commands.add_parser("model", help="manage local checkpoints (meridian model init --help)", add_help=False)
    commands.add_parser("policy", help="policy tools: hash-key KEY, check [DIR]", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    args = build_parser().parse_args(argv)
    if args.command == "gateway":
        return _gateway_main(args)
    from meridian.federation.up import up_main

    return up_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
