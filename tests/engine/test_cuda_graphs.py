"""How decode steps map onto captured CUDA-graph batch sizes, and how they are padded (pure
functions; the padded step's numerics are checked in triton_backend/test_engine.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.engine import LLMEngine
from regional_node.engine.attention.base import PrefillSpan, StepLayout
from regional_node.engine.config import EngineConfig
from regional_node.engine.cuda_graphs import PADDING_SLOT, capture_sizes, graph_batch_size, pad_decode_step
from regional_node.engine.errors import EngineConfigError


def test_capture_sizes_are_powers_of_two_then_multiples_of_16_up_to_max_num_seqs() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_sizes(50) == [1, 2, 4, 8, 16, 32, 48, 50]
    assert capture_sizes(256)[-3:] == [224, 240, 256]


@pytest.mark.parametrize(
    ("num_seqs", "expected"), [(1, 1), (3, 4), (8, 8), (9, 16), (33, 48), (50, 50), (51, None)]
)
def test_a_batch_replays_the_smallest_graph_that_holds_it(num_seqs: int, expected: int | None) -> None:
    assert graph_batch_size(num_seqs, capture_sizes(50)) == expected


def test_padding_adds_sequences_that_write_no_kv_and_attend_to_nothing() -> None:
    layout = StepLayout(
        num_tokens=2,
        slot_mapping=[37, 5],
        decode_block_tables=[[4, 2, 9], [0]],
        decode_context_lens=[38, 6],
    )
    ids, positions, padded = pad_decode_step([11, 12], [37, 5], layout, 4)
    assert ids == [11, 12, 0, 0] and positions == [37, 5, 0, 0]
    assert padded.num_tokens == 4
    assert padded.slot_mapping == [37, 5, PADDING_SLOT, PADDING_SLOT]
    assert padded.decode_block_tables == [[4, 2, 9], [0], [], []]
    assert padded.decode_context_lens == [38, 6, 0, 0]
    assert layout.num_tokens == 2 and len(layout.slot_mapping) == 2  # the step itself is untouched


def test_steps_with_a_prefill_chunk_are_never_padded() -> None:
    layout = StepLayout(num_tokens=3, slot_mapping=[0, 1, 2], prefills=[PrefillSpan(0, 3, 3, [0])])
    with pytest.raises(AssertionError):
        pad_decode_step([1, 2, 3], [0, 1, 2], layout, 4)


def test_cuda_graphs_are_ignored_on_cpu(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir, cuda_graphs=True)
    assert engine.runner.decode_graphs is None


def test_config_rejects_an_unknown_backend_and_a_non_boolean_graph_flag() -> None:
    with pytest.raises(EngineConfigError, match="attention_backend must be one of auto, torch, triton, vllm"):
        EngineConfig(attention_backend="flash")
    with pytest.raises(EngineConfigError, match="cuda_graphs must be true or false"):
        EngineConfig(cuda_graphs="yes")  # type: ignore[arg-type]
