"""`meridian up`'s flags. Environment variables give the defaults where a flag is awkward
(`make up` passes no flags): MERIDIAN_PORT, MERIDIAN_ADMIN_PORT, MERIDIAN_HOME, MERIDIAN_DEMO_API_KEY,
MERIDIAN_CHECKPOINTS."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="gateway listen address (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="gateway port (default $MERIDIAN_PORT or 8080); nodes use free ports",
    )
    parser.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="the gateway's admin listener, serving /metrics on 127.0.0.1 (default $MERIDIAN_ADMIN_PORT or 9464)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where checkpoints, generated configs and logs go (default $MERIDIAN_HOME or ./.meridian)",
    )
    parser.add_argument("--policies", type=Path, default=Path("policies"), help="tenant policy folder")
    parser.add_argument(
        "--checkpoints",
        choices=("trained", "random"),
        default=None,
        help="trained (default $MERIDIAN_CHECKPOINTS or trained: about a minute on first run, then "
        "cached in the state dir) or random (instant; every answer is noise)",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for the nodes to be ready"
    )


@dataclass(frozen=True)
class UpOptions:
    host: str
    port: int
    state_dir: Path
    policies: Path
    ready_timeout_s: float
    demo_api_key: str | None  # None: generate one
    trained: bool = True
    admin_port: int = 9464  # the admin listener (/metrics), always on 127.0.0.1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> UpOptions:
        port = args.port if args.port is not None else int(os.environ.get("MERIDIAN_PORT") or 8080)
        admin_port = (
            args.admin_port
            if args.admin_port is not None
            else int(os.environ.get("MERIDIAN_ADMIN_PORT") or 9464)
        )
        state_dir = args.state_dir or Path(os.environ.get("MERIDIAN_HOME") or ".meridian")
        return cls(
            host=args.host,
            port=port,
            state_dir=state_dir.resolve(),
            policies=args.policies.resolve(),
            ready_timeout_s=args.ready_timeout,
            demo_api_key=os.environ.get("MERIDIAN_DEMO_API_KEY") or None,
            trained=(args.checkpoints or os.environ.get("MERIDIAN_CHECKPOINTS") or "trained") != "random",
            admin_port=admin_port,
        )
