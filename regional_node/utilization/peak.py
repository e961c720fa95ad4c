"""The device's peak compute and memory bandwidth: the denominators of MFU and MBU.

GPUs: NVIDIA's datasheet numbers (dense, no sparsity) for the dtype the model serves in, looked up
by the name torch reports. CPUs, and GPUs not in the table: measured once at start — the best of
3 square 384x384 matmuls (2*n^3 FLOPs each) and of 3 copies of a 32 MiB tensor (read + write) in the
serving dtype, on the threads torch uses then. A measured peak is what this machine reaches on a
dense kernel, not a datasheet's, so a CPU node's MFU reads near 1 only when its steps run as fast
as a plain matmul; the source ("table" or "measured") is exported beside the numbers.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

# (substring of torch.cuda.get_device_name(), 16-bit tensor FLOP/s, float32 FLOP/s, bytes/s).
# First match wins: the more specific names come first.
GPU_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    ("H200", 989.4e12, 66.9e12, 4.8e12),
    ("H100 PCIe", 756.0e12, 51.2e12, 2.0e12),
    ("H100 NVL", 835.0e12, 60.0e12, 3.9e12),
    ("H100", 989.4e12, 66.9e12, 3.35e12),  # SXM5 (e.g. "NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 312.0e12, 19.5e12, 2.039e12),
    ("A100 80GB PCIe", 312.0e12, 19.5e12, 1.935e12),
    ("A100", 312.0e12, 19.5e12, 1.555e12),  # the 40 GB parts
    ("L40S", 362.05e12, 91.6e12, 0.864e12),
    ("L4", 121.0e12, 30.3e12, 0.3e12),
    ("A10", 125.0e12, 31.2e12, 0.6e12),
    ("T4", 65.0e12, 8.1e12, 0.32e12),
)


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    bytes_per_s: float
    source: str  # "table: <name>" or "measured"


def table_peak(device_name: str, dtype: str) -> Peak | None:
    for name, half, single, bandwidth in GPU_PEAKS:
        if name in device_name:
            return Peak(single if dtype == "float32" else half, bandwidth, f"table: {name}")
    return None


@functools.lru_cache(maxsize=8)
def device_peak(device: str, dtype: str) -> Peak:
    """The peak for `device` ("cpu", "cuda", "cuda:1") in `dtype`; measured when not in the table."""
    import torch

    if device.startswith("cuda"):
        found = table_peak(torch.cuda.get_device_name(torch.device(device)), dtype)
        if found is not None:
            return found
    return measure_peak(device, dtype)


def measure_peak(device: str, dtype: str, *, n: int = 384, copy_mib: int = 32, repeats: int = 3) -> Peak:
    import torch

    torch_dtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    src = torch.empty(copy_mib * 2**20 // a.element_size(), device=device, dtype=torch_dtype)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def best(run: object) -> float:
        times = []
        for _ in range(repeats + 1):  # the first warms caches and allocator
            sync()
            started = time.perf_counter()
            run()  # type: ignore[operator]
            sync()
            times.append(time.perf_counter() - started)
        return min(times[1:])

    matmul_s = best(lambda: torch.mm(a, b))
    copy_s = best(lambda: dst.copy_(src))
    return Peak(2 * n**3 / matmul_s, 2 * src.numel() * src.element_size() / copy_s, "measured")
