"""Operator commands for policy files.

python -m gateway.policy hash-key [KEY]   # print sha256:<hex> for api_keys; KEY from stdin if omitted
python -m gateway.policy check [DIR]      # validate a policy directory (default: policies)
"""

from __future__ import annotations

import argparse
import sys

from gateway.policy.errors import PolicyError
from gateway.policy.keys import hash_api_key
from gateway.policy.loader import load_policy_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.policy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    hash_key = commands.add_parser("hash-key", help="print the sha256:<hex> hash of an API key")
    hash_key.add_argument("key", nargs="?", help="the key; read from stdin when omitted")
    check = commands.add_parser("check", help="validate every policy file in a directory")
    check.add_argument("directory", nargs="?", default="policies")
    args = parser.parse_args(argv)

    if args.command == "hash-key":
        key = args.key if args.key is not None else sys.stdin.readline().rstrip("\r\n")
        if not key:
            print("error: empty API key", file=sys.stderr)
            return 2
        print(hash_api_key(key))
        return 0
    try:
        policies = load_policy_dir(args.directory)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.directory}: {len(policies)} tenants OK ({', '.join(sorted(policies.by_id))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
