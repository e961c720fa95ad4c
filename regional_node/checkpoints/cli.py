"""`meridian model init OUT_DIR --arch ... --size ... [--train [--steps N]]`: write a local
checkpoint, random or briefly trained on the corpus. `meridian model certify CHECKPOINT`: record
its golden probe outputs (regional_node/probes/certify.py).

meridian/cli.py either calls `model_init_main(argv_after_model)` or mounts `add_model_commands` on
its own subparsers; `python -m regional_node.checkpoints init ...` runs the same code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regional_node.checkpoints.errors import CheckpointError, CheckpointExistsError
from regional_node.checkpoints.sizes import ARCHES, SIZES
from regional_node.checkpoints.train import TrainingPlan, default_steps, stderr_progress
from regional_node.checkpoints.writer import write_checkpoint
from regional_node.probes.certify import add_certify_command


def configure_model_parser(parser: argparse.ArgumentParser) -> None:
    """Add the `init` subcommand to a parser that stands for `meridian model`."""
    commands = parser.add_subparsers(dest="model_command", required=True, metavar="COMMAND")
    init = commands.add_parser("init", help="write a random-initialised checkpoint (Hugging Face layout)")
    init.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    init.add_argument("--arch", choices=ARCHES, default="llama")
    init.add_argument("--size", choices=list(SIZES), default="tiny")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--vocab-size", type=int, default=None, help="default: the size's vocabulary")
    init.add_argument(
        "--force", action="store_true", help="overwrite the checkpoint files in a non-empty OUT_DIR"
    )
    init.add_argument(
        "--train",
        action="store_true",
        help="train briefly on the bundled corpus instead of writing random weights (deterministic)",
    )
    init.add_argument(
        "--steps", type=int, default=None, help="training steps with --train (default: per size, see README)"
    )
    parser.set_defaults(handler=run_model_command)
    add_certify_command(commands)  # `certify` sets its own handler


def add_model_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Mount `model ...` on an existing `add_subparsers()` object; dispatch with `args.handler(args)`."""
    parser = subparsers.add_parser("model", help="manage local model checkpoints")
    configure_model_parser(parser)
    return parser


def run_model_command(args: argparse.Namespace) -> int:
    training = None
    if args.train:
        steps = args.steps if args.steps is not None else default_steps(args.size)
        if steps < 1:
            print("meridian model init: --steps must be at least 1", file=sys.stderr)
            return 2
        training = TrainingPlan(steps=steps, seed=args.seed)
    elif args.steps is not None:
        print("meridian model init: --steps needs --train", file=sys.stderr)
        return 2
    try:
        summary = write_checkpoint(
            args.out_dir,
            arch=args.arch,
            size=args.size,
            seed=args.seed,
            vocab_size=args.vocab_size,
            force=args.force,
            training=training,
            progress=stderr_progress(f"training {args.arch}/{args.size}") if training else None,
        )
    except CheckpointExistsError as error:
        print(f"meridian model init: {error} (pass --force to overwrite)", file=sys.stderr)
        return 1
    except CheckpointError as error:
        print(f"meridian model init: {error}", file=sys.stderr)
        return 1
    print(summary.line())
    return 0


def model_init_main(argv: list[str]) -> int:
    """Entry point for the words after `meridian model`, e.g. `["init", "out", "--size", "tiny"]`."""
    parser = argparse.ArgumentParser(prog="meridian model", description="Manage local model checkpoints.")
    configure_model_parser(parser)
    args = parser.parse_args(argv)
    return args.handler(args)
