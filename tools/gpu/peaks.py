"""The device's peak throughput, the yardstick of the layer figures: from the vendors' sheets by device
name, and as measured here (a large copy and a large bf16 matrix product), since a lent machine may run
below its sheet."""

from __future__ import annotations

import torch

from tools.gpu.measuring import cuda_ms

# Dense bf16 tensor-core peak and HBM bandwidth from the vendors' sheets, by a substring of the device name.
SPEC_PEAKS = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12)}


def spec_peaks(device_name: str) -> tuple[float | None, float | None]:
    for key, peaks in SPEC_PEAKS.items():
        if key in device_name:
            return peaks
    return None, None


def measured_peaks() -> dict:
    """A device-to-device copy of 1 GiB (bytes read + written) and an 8192^3 bf16 matrix product."""
    return {"copy_tb_s": round(_copy_tb_s(), 3), "bf16_matmul_tflops": round(_matmul_tflops(), 1)}


def _copy_tb_s() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = cuda_ms(lambda: y.copy_(x), warmup=2, reps=5)["ms"]
    return 2 * x.numel() / (t / 1e3) / 1e12


def _matmul_tflops() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = cuda_ms(lambda: a @ b, warmup=3, reps=10)["ms"]
    return 2 * 8192**3 / (t / 1e3) / 1e12
