"""Fused residual add + zero-centred RMSNorm: one program per row, the whole row in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, stride_x, stride_r, stride_y, stride_h, N, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # round to the io dtype first so the norm sees exactly the residual that is carried forward
        h = x.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * (1.0 + w)).to(y_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    # a [..., N] tensor as [rows, N] without copying when the last dim is contiguous
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
            out: torch.Tensor | None = None,
            residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * (1 + w)`` in fp32; returns (y, h).

    x, residual [..., N] (bf16/fp16/fp32); weight [N]. ``out``/``residual_out`` may be given (``residual_out`` may be
    ``residual`` itself, for an in-place residual stream). Without a residual, h is x.
    """
    N = x.shape[-1]
    x2 = _rows(x)
    y = torch.empty_like(x) if out is None else out
    y2 = y.view(-1, N)
    if residual is None:
        r2, h, h2 = x2, x, x2
    else:
        r2 = _rows(residual)
        h = torch.empty_like(x) if residual_out is None else residual_out
        h2 = h.view(-1, N)
    BLOCK = triton.next_power_of_2(N)
    num_warps = min(max(BLOCK // 512, 1), 16)
    on = pdl.active(x)
    _rmsnorm_kernel[(x2.shape[0],)](x2, r2, weight, y2, h2, x2.stride(0), r2.stride(0), y2.stride(0), h2.stride(0),
                                    N, eps, HAS_RESIDUAL=residual is not None, BLOCK=BLOCK, PDL=on,
                                    num_warps=num_warps, **pdl.launch(on))
    return y, h
