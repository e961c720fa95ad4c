"""`python -m regional_node node ...`: run a regional node (see regional_node/cli.py)."""

from regional_node.cli import main

# Guarded: with `engine: vllm`, vLLM starts its engine-core process with multiprocessing's spawn,
# which imports this module again in the child.
if __name__ == "__main__":
    raise SystemExit(main())
