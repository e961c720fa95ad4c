"""`meridian safety` (or `python -m gateway.safety`): tools for the safety layer.

meridian safety init-model PATH            write the keyword demo classifier (demo_model.py)
meridian safety audit FILE [--tenant T] [--request-id R] [--action A] [--where W]
                                           the audit log's records that match, one JSON a line
"""

from __future__ import annotations

import argparse
import json
import sys

from gateway.safety.audit import read_audit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meridian safety", description="Safety layer tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    init = commands.add_parser("init-model", help="write the keyword demo classifier (ONNX) to PATH")
    init.add_argument("path")
    init.add_argument(
        "--category",
        action="append",
        metavar="NAME=WORD,WORD",
        help="a category and its keywords (repeatable; default: injection and toxicity)",
    )
    audit = commands.add_parser("audit", help="query a JSONL audit log")
    audit.add_argument("file")
    audit.add_argument("--tenant")
    audit.add_argument("--request-id")
    audit.add_argument("--action", help="block, redact, flag, pass, unscanned or error")
    audit.add_argument("--where", choices=("input", "output"))
    args = parser.parse_args(argv)
    if args.command == "init-model":
        from gateway.safety.demo_model import DEFAULT_KEYWORDS, write_keyword_model

        keywords: dict[str, tuple[str, ...]] = dict(DEFAULT_KEYWORDS)
        if args.category:
            keywords = {}
            for spec in args.category:
                name, _, words = spec.partition("=")
                if not name or not words:
                    parser.error(f"--category expects NAME=WORD,WORD, got {spec!r}")
                keywords[name] = tuple(w for w in words.split(",") if w)
        out = write_keyword_model(args.path, keywords)
        print(f"wrote {out}/model.onnx, tokenizer.json, config.json (labels: {', '.join(keywords)})")
        return 0
    try:
        for record in read_audit(
            args.file, tenant=args.tenant, request_id=args.request_id, action=args.action
        ):
            if args.where is None or record.get("where") == args.where:
                print(json.dumps(record, ensure_ascii=False))
    except OSError as exc:
        print(f"meridian safety audit: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
