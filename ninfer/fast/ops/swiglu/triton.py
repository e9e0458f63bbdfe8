"""SwiGLU on a fused [gate | up] row: fp32 math, one rounding on the store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _swiglu_kernel(x_ptr, o_ptr, I, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * stride_o + cols, (gate * tl.sigmoid(gate) * up).to(o_ptr.dtype.element_ty), mask=mask)


def swiglu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] (gate columns first, then up) -> [T, I] in x's dtype."""
    T, two_i = x.shape
    assert two_i % 2 == 0 and x.stride(1) == 1
    I = two_i // 2
    out = x.new_empty(T, I) if out is None else out
    BLOCK = min(1024, triton.next_power_of_2(I))
    on = pdl.active(x)
    _swiglu_kernel[(T, triton.cdiv(I, BLOCK))](x, out, I, x.stride(0), out.stride(0), BLOCK=BLOCK, PDL=on,
                                               **pdl.launch(on))
    return out
