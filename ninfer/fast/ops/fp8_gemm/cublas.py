"""The A8 prefill GEMM through cuBLAS's blockwise FP8 (``torch._scaled_mm`` with 1x128 activation and 128x128 weight
scales, DeepSeek-V3's recipe, as the Triton kernel beside it computes it): on an H100 at the 9B's projections with
8192 rows it ran 1.6x faster than bf16 cuBLAS, where the Triton kernel ran at 0.7x (docs/performance.md, fourteenth
session, `bench_qgemv.py --gemm 8192`).

cuBLAS takes the activation scales [M, K/128] column-major (stride (1, M)) and the weight scales [K/128, N/128] as
the transpose of the stored [N/128, K/128]; the weight [N, K] goes in as its column-major transpose. Only 128x128
weight blocks over K and N in whole blocks, with bf16 activations, qualify; a shape or build cuBLAS refuses (a
RuntimeError at the call, before anything is queued) is remembered per (M mod 16, N, K), and the caller runs the
Triton kernel instead. The first call of each prefill shape runs in the Program's warm-up, before any graph capture,
so a refusal never happens inside one."""

from __future__ import annotations

import torch

from ninfer.fast.ops.qlinear.layout import QuantWeight

BLOCK = 128
_REFUSED: set[tuple[int, int, int]] = set()


def eligible(x: torch.Tensor, w: QuantWeight) -> bool:
    """Whether this product may go to cuBLAS: CUDA, bf16 activations, 128x128 weight blocks tiling N and K, and no
    earlier refusal of its shape."""
    N, K = w.n, w.k
    return (x.is_cuda and x.dtype == torch.bfloat16 and w.block_rows == BLOCK and w.block_cols == BLOCK
            and N % BLOCK == 0 and K % BLOCK == 0 and (x.shape[0] % 16, N, K) not in _REFUSED)


def blockwise_fp8(xq: torch.Tensor, xs: torch.Tensor, w: QuantWeight) -> torch.Tensor | None:
    """xq e4m3 [M, K], xs fp32 [M, K/128] (``quantize_rows_fp8`` at block 128) -> bf16 [M, N], or None where cuBLAS
    refuses this shape (remembered)."""
    M, K = xq.shape
    try:
        return torch._scaled_mm(xq, w.data.t(), xs.t().contiguous().t(), w.scales.t(), out_dtype=torch.bfloat16)
    except RuntimeError:  # this cuBLAS or torch lacks the recipe or the layout: the Triton kernel takes it
        _REFUSED.add((M % 16, w.n, K))
        return None
