"""Routed MoE experts with quantized expert stacks.

Decode (at most ``DECODE_TOKENS`` tokens): every (token, slot) pair streams its expert's packed rows once through
the quantized GEMV's pair mode (``qgemv_pairs``): gate_up with SwiGLU fused into the epilogue -> down scaled by the
routing weight in fp32 -> the k slots of each token summed in slot order (deterministic). No host sync, so it runs
inside the decode graph. At B <= 8 and top-8 most pairs hit distinct experts, so per-pair streaming reads about what
a grouped kernel would.

Prefill: the expert stacks are dequantized to the activation dtype (one kernel per stack, the [E, N, K] stack seen
as [E*N, K] rows) and the dense grouped kernels (``ninfer.fast.ops.moe``) run on them; the dense stacks are
transient (counted in the memory plan's workspace).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ninfer.fast.ops.moe.triton import moe_experts
from ninfer.fast.ops.qlinear import QuantWeight
from ninfer.fast.ops.qlinear.triton import dequantize, qgemv_pairs

DECODE_TOKENS = 16


def flat_rows(w: QuantWeight) -> QuantWeight | None:
    """An [E, N, K] stack as one [E*N, K] weight over the same storage (None when fp8 row blocks straddle experts)."""
    E, N, K = w.shape
    if w.block_rows > 1 and N % w.block_rows:
        return None
    rs = None if w.row_scale is None else w.row_scale.reshape(E * N)
    zs = None if w.zeros is None else w.zeros.reshape(E * N, -1)
    # act-order stacks keep one column order per expert: dequantized in stored order, then scattered back
    return replace(w, shape=(E * N, K), data=w.data.reshape(E * N, -1), scales=w.scales.reshape(-1, w.scales.shape[-1]),
                   row_scale=rs, zeros=zs, perm=None)


def dense_stack(w, dtype: torch.dtype) -> torch.Tensor:
    """A quantized [E, N, K] stack as a dense tensor in ``dtype`` (a dense stack is returned as it is)."""
    if not isinstance(w, QuantWeight):
        return w
    E, N, K = w.shape
    flat = flat_rows(w)
    if flat is not None:
        stored = dequantize(flat, dtype).view(E, N, K)
    else:
        stored = torch.stack([dequantize(replace(w.expert(e), perm=None), dtype) for e in range(E)])
    if w.perm is None:
        return stored
    # stored column j of expert e is logical column perm[e, j]
    return torch.empty_like(stored).scatter_(2, w.perm.long()[:, None, :].expand(E, N, K), stored)


def qmoe_experts(x: torch.Tensor, w_gate_up, w_down, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Same contract as ``moe_experts_naive``: x [T, H] -> [T, H] in x's dtype."""
    T, k = ids.shape
    both = isinstance(w_gate_up, QuantWeight) and isinstance(w_down, QuantWeight)
    if T > DECODE_TOKENS or not both:
        return moe_experts(x, dense_stack(w_gate_up, x.dtype), dense_stack(w_down, x.dtype), weights, ids)
    act = qgemv_pairs(x, w_gate_up, ids, k, a_per_pair=False, swiglu=True)  # [T*k, I]
    y = qgemv_pairs(act, w_down, ids, k, a_per_pair=True, pair_weights=weights, out_dtype=torch.float32)  # [T*k, H]
    return y.view(T, k, -1).sum(1).to(x.dtype)
