"""The A8 prefill GEMM of an FP8 block weight in plain fp32 torch: activations quantized to e4m3 per token and per
weight column block, then the exact product of the two dequantized operands."""

from __future__ import annotations

import torch

from ninfer.fast.ops.qlinear.layout import QuantWeight
from ninfer.fast.ops.qlinear.naive import qlinear_a8_naive, quantize_rows_fp8_naive


def fp8_gemm_naive(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; w an FP8 QuantWeight whose Uses allow A8."""
    return qlinear_a8_naive(x, w)


__all__ = ["fp8_gemm_naive", "quantize_rows_fp8_naive"]
