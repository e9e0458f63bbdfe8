"""Quantized linear layers in plain fp32 torch: dequantize by the format's math, then ``F.linear``. The oracle of
the Triton kernels, and the CPU fast model's path (``Kernels`` "naive")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layout import QKind, QuantWeight, a8_block

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _codes4(data: torch.Tensor) -> torch.Tensor:
    # uint8 [.., K/2] -> codes [.., K], element 2j in the low nibble of byte j
    return torch.stack([data & 15, data >> 4], dim=-1).flatten(-2)


def _codes5(data: torch.Tensor) -> torch.Tensor:
    # uint8 [.., K*5/8]: every 5 bytes are a 40-bit little-endian integer holding 8 codes, code j at bits 5j
    b = data.reshape(*data.shape[:-1], -1, 5).long()
    acc = sum(b[..., i] << (8 * i) for i in range(5))
    return torch.stack([(acc >> (5 * j)) & 31 for j in range(8)], dim=-1).flatten(-2)


def dequantize_naive(w: QuantWeight) -> torch.Tensor:
    """All values of w as fp32 [.., N, K]."""
    n, k = w.n, w.k
    if w.kind == QKind.FP8:
        s = w.scales.float().repeat_interleave(w.block_rows, -2)[..., :n, :]
        s = s.repeat_interleave(w.block_cols, -1)[..., :k]
        return w.data.float() * s
    if w.kind == QKind.NVFP4:
        codes = _codes4(w.data).long()
        table = torch.tensor(_E2M1, device=w.device)
        v = torch.where(codes >= 8, -table[codes & 7], table[codes & 7])
        # the format's order: e2m1 * (e4m3(scale) * global)
        return v * (w.scales.float() * w.row_scale.float()[..., None]).repeat_interleave(16, -1)
    codes = {QKind.INT4: _codes4, QKind.INT5: _codes5, QKind.INT8: lambda d: d}[w.kind](w.data)
    z = (w.zeros.float() if w.zeros is not None else torch.full_like(w.scales, 1 << (w.kind.bits - 1),
                                                                     dtype=torch.float32))
    g = w.block_cols
    stored = (codes.float() - z.repeat_interleave(g, -1)) * w.scales.float().repeat_interleave(g, -1)
    if w.perm is None:
        return stored
    # stored column j is logical column perm[j]
    return torch.empty_like(stored).scatter_(-1, w.perm.long().unsqueeze(-2).expand_as(stored), stored)


def qlinear_naive(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x [M, K] @ dequant(w) [N, K]^T -> [M, N] in x's dtype, fp32 accumulation."""
    return F.linear(x.float(), dequantize_naive(w)).to(x.dtype)


def qlinear_a8_naive(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """The A8 form of an FP8 block weight: x quantized to e4m3 per token and per ``a8_block(w)`` columns (scale =
    amax / 448), then the exact product of the two dequantized operands."""
    block = a8_block(w)
    xq, xs = quantize_rows_fp8_naive(x.float(), block)
    xd = xq.float() * xs.repeat_interleave(block, -1)[:, :x.shape[1]]
    return F.linear(xd, dequantize_naive(w)).to(x.dtype)


def quantize_rows_fp8_naive(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K/block)]), each block's amax mapped onto 448."""
    M, K = x.shape
    nb = -(-K // block)
    xp = F.pad(x.float(), (0, nb * block - K)).view(M, nb, block)
    s = xp.abs().amax(-1).clamp_min(1e-12) / 448.0
    q = (xp / s[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(M, nb * block)[:, :K]
    return q, s
