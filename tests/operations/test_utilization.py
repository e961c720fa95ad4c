"""MFU and MBU per phase against a hand calculation (regional_node/utilization, issue 34)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regional_node.utilization import ModelShape, Peak, UtilizationMeter
from regional_node.utilization.work import Chunk, StepWork, step_work

# L=2 layers, d=64, H=4 heads, K=2 KV heads, h=16, I=128, V=2048, float32 (4 bytes).
SHAPE = ModelShape(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=2048,
    bytes_per_param=4,
)
PEAK = Peak(flops_per_s=1e9, bytes_per_s=1e8, source="test")

# An 8-token prompt from position 0 (sampled: it completes), and two decodes at positions 20 and 5.
MIXED = [
    Chunk(start=0, num_tokens=8, sampled=True, decode=False),
    Chunk(start=20, num_tokens=1, sampled=True, decode=True),
    Chunk(start=5, num_tokens=1, sampled=True, decode=True),
]


def test_step_work_matches_the_hand_calculation() -> None:
    # Linear parameters per layer: 64*(4+2*2)*16 + 4*16*64 + 3*64*128 = 8192 + 4096 + 24576 = 36864.
    assert SHAPE.linear_params_per_layer == 36864
    work = step_work(SHAPE, MIXED)
    # 10 tokens; (query, key) pairs: 8*0 + 8*9/2 = 36, then 21 and 6: 63; 3 sampled rows.
    # FLOPs: 2*2*36864*10 + 4*2*4*16*63 + 2*64*2048*3 = 1474560 + 32256 + 786432.
    assert work == StepWork(phase="prefill", tokens=10, flops=2_293_248.0, bytes=844_800.0)
    # Bytes: weights 4*(2*36864 + 2048*64) = 819200; embeddings 10*64*4 = 2560; KV positions read
    # and written (8+8) + (21+1) + (6+1) = 45, at 2*2*2*16*4 = 512 bytes each: 23040.
    assert SHAPE.weight_bytes == 819_200 and SHAPE.kv_bytes_per_position == 512


def test_a_decode_only_step_is_a_decode_step() -> None:
    work = step_work(SHAPE, MIXED[1:])
    assert work.phase == "decode" and work.tokens == 2
    assert work.flops == 2 * 2 * 36864 * 2 + 4 * 2 * 4 * 16 * (21 + 6) + 2 * 64 * 2048 * 2


def test_utilization_per_phase_over_the_window() -> None:
    meter = UtilizationMeter(SHAPE, PEAK, window_s=60.0)
    meter.record(step_work(SHAPE, MIXED), seconds=0.01, ended=100.0)
    meter.record(step_work(SHAPE, MIXED[1:]), seconds=0.002, ended=100.01)
    report = meter.report(now=100.02)
    assert report.utilization["prefill"].mfu == pytest.approx(2_293_248 / (1e9 * 0.01))
    assert report.utilization["prefill"].mbu == pytest.approx(844_800 / (1e8 * 0.01))
    decode = step_work(SHAPE, MIXED[1:])
    assert report.utilization["decode"].mfu == pytest.approx(decode.flops / (1e9 * 0.002))
    assert report.utilization["decode"].mbu == pytest.approx(decode.bytes / (1e8 * 0.002))
    assert report.totals["prefill"].tokens == 10 and report.totals["decode"].tokens == 2
    # A minute later the window is empty (an idle phase reads 0); the totals stay.
    later = meter.report(now=100.02 + 61)
    assert later.utilization["prefill"].mfu == 0 and later.utilization["decode"].mbu == 0
    assert later.totals["prefill"].flops == 2_293_248


def test_the_gpu_table_and_the_measured_cpu_peak() -> None:
    from regional_node.utilization.peak import measure_peak, table_peak

    assert table_peak("NVIDIA H100 80GB HBM3", "bfloat16") == Peak(989.4e12, 3.35e12, "table: H100")
    assert table_peak("NVIDIA H100 PCIe", "float32") == Peak(51.2e12, 2.0e12, "table: H100 PCIe")
    assert table_peak("Some Unknown Accelerator", "bfloat16") is None
    measured = measure_peak("cpu", "float32", n=128, copy_mib=4, repeats=2)
    assert measured.source == "measured" and measured.flops_per_s > 0 and measured.bytes_per_s > 0


chunks = st.lists(
    st.builds(
        lambda start, n, sampled: Chunk(
            start=start, num_tokens=n, sampled=sampled, decode=n == 1 and start > 0
        ),
        st.integers(0, 4096),
        st.integers(1, 512),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@given(chunks, chunks)
def test_work_adds_up_over_chunks_with_the_weights_read_once_per_step(a: list[Chunk], b: list[Chunk]) -> None:
    # Batching two sets of chunks into one step costs their FLOPs summed, and their bytes summed
    # less one read of the weights: the saving batching exists for.
    one, two, both = step_work(SHAPE, a), step_work(SHAPE, b), step_work(SHAPE, a + b)
    assert both.flops == one.flops + two.flops
    assert both.bytes == one.bytes + two.bytes - SHAPE.weight_bytes
    assert both.tokens == one.tokens + two.tokens
    assert both.phase == ("decode" if one.phase == two.phase == "decode" else "prefill")
