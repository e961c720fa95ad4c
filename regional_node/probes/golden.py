"""A model version's golden outputs: fixed prompts, their greedy token ids and the chosen tokens'
log-probabilities, recorded when the version is certified (`meridian model certify`).

Greedy decoding is deterministic, so a model that answers a probe differently than it did at
certification is a different model — bad weights in memory, a broken kernel, a wrong dtype, a
mismatched tokenizer — whatever its health checks say. The token ids must match exactly; the
log-probabilities within a tolerance fit for the dtype (bf16 rounds logits to ~3 significant
digits, so batch composition moves them by more than float32 ever does).

The file lives next to the checkpoint (GOLDEN_FILE) unless the node's config points elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgspec

GOLDEN_FILE = "meridian-golden.json"
FORMAT = 1

# Prompts chosen to be plain and varied (code, prose, numbers, another language): a broken
# tokenizer or kernel rarely leaves all of them unchanged.
PROBE_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "Once upon a time, in a small village,",
    "Der schnelle braune Fuchs",
)
PROBE_MAX_TOKENS = 16
# Token ids for a checkpoint without a tokenizer: one prompt, spread over a small vocabulary.
_ID_PROMPT = [1, 7, 42, 99, 3, 5]

# Absolute tolerance on each chosen token's logprob, by the dtype the model computes in.
LOGPROB_TOLERANCE = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.15}


class ProbeCase(msgspec.Struct, kw_only=True, frozen=True):
    prompt: str  # "" for an id-only prompt (no tokenizer)
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


class GoldenSet(msgspec.Struct, kw_only=True, frozen=True):
    format: int = FORMAT
    checkpoint: str  # the certified folder's checkpoint hash (regional_node/server/checkpoint.py)
    dtype: str
    logprob_tolerance: float
    cases: list[ProbeCase]


class GoldenFileError(Exception):
    """The golden file cannot be read or is not one this node understands."""


@dataclass(frozen=True)
class ProbeOutput:
    """What the model answered to one case now."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    detail: str  # what differed first, or "n cases match"


def golden_path(checkpoint: str | Path, configured: str | None = None) -> Path:
    return Path(configured) if configured else Path(checkpoint) / GOLDEN_FILE


def read_golden(path: Path) -> GoldenSet:
    try:
        golden = msgspec.json.decode(path.read_bytes(), type=GoldenSet)
    except OSError as exc:
        raise GoldenFileError(f"{path}: cannot read the golden file: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise GoldenFileError(f"{path}: not a golden file: {exc}") from None
    if golden.format != FORMAT:
        raise GoldenFileError(f"{path}: golden file format {golden.format}, this node reads {FORMAT}")
    if not golden.cases:
        raise GoldenFileError(f"{path}: the golden file has no probe cases")
    return golden


def write_golden(path: Path, golden: GoldenSet) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(golden), indent=2) + b"\n")


def tolerance_for(dtype: str) -> float:
    return LOGPROB_TOLERANCE.get(dtype, LOGPROB_TOLERANCE["bfloat16"])


def compare(golden: GoldenSet, outputs: list[ProbeOutput]) -> Verdict:
    """Pass when every case's prompt ids and greedy ids match and each logprob is within tolerance."""
    if len(outputs) != len(golden.cases):
        return Verdict(False, f"{len(outputs)} answers for {len(golden.cases)} probe cases")
    for index, (case, out) in enumerate(zip(golden.cases, outputs, strict=True)):
        if out.prompt_token_ids != case.prompt_token_ids:
            return Verdict(False, f"case {index}: the tokenizer encodes the prompt differently")
        if out.token_ids != case.token_ids:
            at = next(
                (i for i, (a, b) in enumerate(zip(out.token_ids, case.token_ids, strict=False)) if a != b),
                min(len(out.token_ids), len(case.token_ids)),
            )
            got = out.token_ids[at] if at < len(out.token_ids) else None
            want = case.token_ids[at] if at < len(case.token_ids) else None
            return Verdict(False, f"case {index}: token {at} is {got}, certified {want}")
        for position, (got_lp, want_lp) in enumerate(zip(out.logprobs, case.logprobs, strict=False)):
            if not math.isfinite(got_lp) or abs(got_lp - want_lp) > golden.logprob_tolerance:
                return Verdict(
                    False,
                    f"case {index}: token {position}'s logprob is {got_lp:.5f}, certified {want_lp:.5f} "
                    f"(tolerance {golden.logprob_tolerance})",
                )
    return Verdict(True, f"{len(outputs)} cases match")


def probe_prompts(has_tokenizer: bool) -> list[tuple[str, list[int] | None]]:
    """(text, ids) per case: texts when the checkpoint can tokenize, else one id prompt."""
    if has_tokenizer:
        return [(text, None) for text in PROBE_PROMPTS]
    return [("", list(_ID_PROMPT))]
