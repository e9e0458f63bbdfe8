"""DFlash2's grouped dynamic depthwise causal convolution: one program per (packed row, column tile), the taps
unrolled, fp32 accumulation, one rounding on the store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dflash_conv_kernel(x_ptr, d_ptr, b_ptr, o_ptr, H, G, GROUP, BLK, stride_x, stride_dn, stride_dt, stride_b,
                        stride_o, TAPS: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    slot = n % BLK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in tl.static_range(TAPS):
        if slot >= t:  # slot i reads slot i - t of its own block only
            x = tl.load(x_ptr + (n - t) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            base = tl.load(b_ptr + t * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
            dyn = tl.load(d_ptr + n * stride_dn + t * stride_dt + cols // GROUP, mask=mask, other=0.0).to(tl.float32)
            acc += (base + dyn) * x
    tl.store(o_ptr + n * stride_o + cols, acc.to(o_ptr.dtype.element_ty), mask=mask)


def dflash_conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, block: int,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, H] (N a multiple of `block`), dyn [N, taps, G] (G = H / group), base [taps, H] -> [N, H] in x's dtype.
    `dyn` may be a strided view (one side of the kernel projection's [N, 2, taps, G] output)."""
    N, H = x.shape
    taps, G = dyn.shape[1], dyn.shape[2]
    assert N % block == 0 and H % G == 0 and base.shape == (taps, H), (x.shape, dyn.shape, base.shape, block)
    assert x.stride(1) == 1 and dyn.stride(2) == 1 and base.stride(1) == 1
    out = x.new_empty(N, H) if out is None else out
    BLOCK = min(1024, triton.next_power_of_2(H))
    _dflash_conv_kernel[(N, triton.cdiv(H, BLOCK))](
        x, dyn, base, out, H, G, H // G, block, x.stride(0), dyn.stride(0), dyn.stride(1), base.stride(0),
        out.stride(0), TAPS=taps, BLOCK=BLOCK)
    return out
