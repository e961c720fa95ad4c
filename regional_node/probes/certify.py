"""`meridian model certify CHECKPOINT`: record a model version's golden outputs next to its weights.

Run it once per version, on the weights that version is meant to be, with the dtype the nodes
will serve it in. Each probe prompt is answered twice: in one batch (as the node's probes run)
and alone; a case is kept only up to the first token where the two differ, because a greedy
choice that batch composition can flip is a near-tie, and a probe built on it would page on
rounding. The node finds the file next to the checkpoint (or where `probes.golden` points).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from regional_node.probes.golden import (
    GOLDEN_FILE,
    PROBE_MAX_TOKENS,
    GoldenSet,
    ProbeCase,
    probe_prompts,
    tolerance_for,
    write_golden,
)
from regional_node.probes.prober import answer_cases


async def certify(checkpoint: Path, *, device: str = "cpu", dtype: str = "float32") -> GoldenSet:
    """The golden set of the checkpoint as our engine serves it on `device` in `dtype`."""
    from regional_node.engine import AsyncEngine, LLMEngine
    from regional_node.server.checkpoint import checkpoint_hash

    engine = AsyncEngine(LLMEngine.from_pretrained(checkpoint, device=device, dtype=dtype))
    await engine.start()
    try:
        prompts = probe_prompts(engine.tokenizer is not None)
        lengths = [PROBE_MAX_TOKENS] * len(prompts)
        batched = await answer_cases(engine, prompts, lengths, tag="certify")
        alone = await answer_cases(engine, prompts, lengths, concurrent=False, tag="certify")
    finally:
        await engine.shutdown()
    cases = []
    for (text, _), together, single in zip(prompts, batched, alone, strict=True):
        stable = next(
            (i for i, (a, b) in enumerate(zip(together.token_ids, single.token_ids, strict=False)) if a != b),
            len(single.token_ids),
        )
        if stable:
            cases.append(
                ProbeCase(
                    prompt=text,
                    prompt_token_ids=single.prompt_token_ids,
                    token_ids=single.token_ids[:stable],
                    logprobs=single.logprobs[:stable],
                )
            )
    if not cases:
        raise RuntimeError("no probe case answers the same in a batch and alone; nothing to certify")
    return GoldenSet(
        checkpoint=checkpoint_hash(str(checkpoint)),
        dtype=dtype,
        logprob_tolerance=tolerance_for(dtype),
        cases=cases,
    )


def add_certify_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "certify", help=f"record the checkpoint's golden probe outputs in CHECKPOINT/{GOLDEN_FILE}"
    )
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--output", type=Path, default=None, help=f"default: CHECKPOINT/{GOLDEN_FILE}")
    parser.set_defaults(handler=run_certify)


def run_certify(args: argparse.Namespace) -> int:
    if not (args.checkpoint / "config.json").is_file():
        print(f"meridian model certify: {args.checkpoint} is not a checkpoint folder", file=sys.stderr)
        return 1
    try:
        golden = asyncio.run(certify(args.checkpoint, device=args.device, dtype=args.dtype))
    except Exception as exc:
        print(f"meridian model certify: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    out = args.output or args.checkpoint / GOLDEN_FILE
    write_golden(out, golden)
    tokens = sum(len(case.token_ids) for case in golden.cases)
    print(
        f"certified {args.checkpoint} ({golden.dtype}): {len(golden.cases)} probes, {tokens} tokens -> {out}"
    )
    return 0
