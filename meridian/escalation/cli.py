"""`meridian escalation calibrate --prompts FILE.jsonl --small M --large M [--gateway URL]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import httpx

from meridian.escalation.calibrate import (
    Calibration,
    CalibrationError,
    Prices,
    collect,
    default_thresholds,
    load_prompts,
    per_prompt,
    render_table,
    threshold_rows,
)
from router.confidence import ConfidenceRule

_DEFAULT = ConfidenceRule()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meridian escalation", description="Tools for `model: auto`.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    calibrate = commands.add_parser(
        "calibrate",
        help="run prompts through both tiers and report, per threshold, escalation rate, agreement and cost",
    )
    calibrate.add_argument(
        "--prompts", type=Path, required=True, help="JSONL: {prompt} or {messages} per line"
    )
    calibrate.add_argument("--small", required=True, help="the small-tier model name")
    calibrate.add_argument("--large", required=True, help="the large-tier model name")
    calibrate.add_argument(
        "--gateway",
        default=os.environ.get("MERIDIAN_GATEWAY", "http://127.0.0.1:8080"),
        help="gateway base URL",
    )
    calibrate.add_argument(
        "--api-key",
        default=os.environ.get("MERIDIAN_API_KEY") or os.environ.get("MERIDIAN_DEMO_API_KEY"),
        help="tenant API key (default $MERIDIAN_API_KEY or $MERIDIAN_DEMO_API_KEY)",
    )
    calibrate.add_argument(
        "--max-tokens", type=int, default=32, help="per answer, unless the prompt sets one"
    )
    calibrate.add_argument("--k-tokens", type=int, default=_DEFAULT.k_tokens)
    calibrate.add_argument("--window", type=int, default=_DEFAULT.window)
    calibrate.add_argument("--mean-weight", type=float, default=_DEFAULT.mean_weight)
    calibrate.add_argument(
        "--thresholds", type=float, nargs="+", default=None, help="default: -8.0 to 0.0 in steps of 0.5"
    )
    calibrate.add_argument(
        "--prices",
        type=float,
        nargs=4,
        metavar=("SMALL_IN", "SMALL_OUT", "LARGE_IN", "LARGE_OUT"),
        default=None,
        help="prices per 1000 tokens; without them cost is counted in tokens",
    )
    calibrate.add_argument("--concurrency", type=int, default=4)
    calibrate.add_argument("--json", type=Path, default=None, help="also write the full report here")
    return parser


def escalation_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.api_key:
        print("meridian escalation calibrate: pass --api-key (or set MERIDIAN_API_KEY)", file=sys.stderr)
        return 2
    if not (1 <= args.window <= args.k_tokens) or not 0 <= args.mean_weight <= 1 or args.concurrency < 1:
        print(
            "meridian escalation calibrate: need 1 <= --window <= --k-tokens, 0 <= --mean-weight <= 1 "
            "and --concurrency >= 1",
            file=sys.stderr,
        )
        return 2
    rule = ConfidenceRule(k_tokens=args.k_tokens, window=args.window, mean_weight=args.mean_weight)
    prices = Prices(*args.prices) if args.prices else Prices()
    try:
        prompts = load_prompts(args.prompts)
        runs = asyncio.run(
            collect(
                args.gateway,
                args.api_key,
                prompts,
                small=args.small,
                large=args.large,
                max_tokens=args.max_tokens,
                concurrency=args.concurrency,
            )
        )
    except (CalibrationError, httpx.HTTPError) as exc:
        print(f"meridian escalation calibrate: {exc}", file=sys.stderr)
        return 1
    thresholds = sorted(args.thresholds) if args.thresholds else default_thresholds()
    calibration = Calibration(
        small=args.small,
        large=args.large,
        rule=rule,
        prices=prices,
        rows=threshold_rows(runs, thresholds, rule, prices),
        prompts=per_prompt(runs, rule),
    )
    print(render_table(calibration))
    if args.json is not None:
        args.json.write_text(json.dumps(calibration.to_json(), indent=2) + "\n", encoding="utf-8")
        print(f"report: {args.json}")
    return 0
