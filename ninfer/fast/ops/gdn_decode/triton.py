"""GDN decode step in two kernels: the conv-window update, then the delta-rule recurrence fused with the gates,
the q/k l2norm and the gated RMSNorm. Every sequence addresses its own conv/SSM state slot through ``slot_ids``;
a negative slot id (a CUDA-graph padding row) reads a zero state and writes no state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_update_kernel(x_ptr, state_ptr, w_ptr, slot_ptr, out_ptr, C, stride_x, stride_slot, stride_o,
                        K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    j = tl.arange(0, BLOCK_K)
    cmask = cols < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    # a padding row sees an empty window and writes none (the limit trick keeps masks as tensors)
    n_win = tl.where(slot >= 0, K - 1, 0)
    in_win = cmask[:, None] & (j[None, :] < K - 1)
    live = cmask[:, None] & (j[None, :] < n_win)
    # the window holds the previous K-1 pre-conv inputs per channel, oldest first: [C, K-1] per slot
    s_ptrs = state_ptr + slot * stride_slot + cols[:, None] * (K - 1) + j[None, :]
    win = tl.load(s_ptrs, mask=live, other=0.0).to(tl.float32)  # [BLOCK_C, BLOCK_K]
    wts = tl.load(w_ptr + cols[:, None] * K + j[None, :], mask=in_win, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * stride_x + cols, mask=cmask, other=0.0)
    w_last = tl.load(w_ptr + cols * K + K - 1, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.sum(win * wts, axis=1) + x.to(tl.float32) * w_last
    tl.store(out_ptr + b * stride_o + cols, (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=cmask)
    # shift the window left by one and append the new input
    shifted = tl.load(s_ptrs + 1, mask=live & (j[None, :] + 1 < K - 1), other=0.0)
    new = tl.where(j[None, :] == K - 2, x[:, None].to(shifted.dtype), shifted)
    tl.store(s_ptrs, new.to(state_ptr.dtype.element_ty), mask=live)


@triton.jit
def _recurrent_kernel(qkv_ptr, z_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, nw_ptr, s_ptr, slot_ptr, y_ptr,
                      stride_qkv, stride_z, stride_a, stride_b, stride_slot, stride_y, scale, eps,
                      HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    kk = tl.arange(0, BK)
    vv = tl.arange(0, BV)
    mk = kk < DK
    mv = vv < DV
    row = qkv_ptr + b * stride_qkv
    q = tl.load(row + hk * DK + kk, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(row + HK * DK + hk * DK + kk, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(row + 2 * HK * DK + hv * DV + vv, mask=mv, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    # gates in fp32; softplus uses torch's threshold of 20
    a = tl.load(a_ptr + b * stride_a + hv).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus
    beta = tl.sigmoid(tl.load(b_ptr + b * stride_b + hv).to(tl.float32))
    s_ptrs = s_ptr + slot * stride_slot + hv * DK * DV + kk[:, None] * DV + vv[None, :]
    # a padding row (slot < 0) starts from a zero state and writes none
    smask = (kk < tl.where(slot >= 0, DK, 0))[:, None] & mv[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0) * tl.exp(g)  # [BK, BV] fp32
    u = beta * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
    S += k[:, None] * u[None, :]
    tl.store(s_ptrs, S, mask=smask)
    o = tl.sum(S * q[:, None], axis=0)  # [BV], read after the write
    # gated RMSNorm over this value head: w * o / rms(o) * silu(z), all in fp32
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / DV + eps)
    w = tl.load(nw_ptr + vv, mask=mv, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + b * stride_z + hv * DV + vv, mask=mv, other=0.0).to(tl.float32)
    y = o * rstd * w * (z * tl.sigmoid(z))
    tl.store(y_ptr + b * stride_y + hv * DV + vv, y.to(y_ptr.dtype.element_ty), mask=mv)


def gdn_conv_update(mixed: torch.Tensor, conv_state: torch.Tensor, conv_weight: torch.Tensor,
                    slot_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(causal conv) of one new input per sequence; mixed [B, C], conv_state [slots, C, K-1] (updated in place),
    conv_weight [C, 1, K] or [C, K], slot_ids [B] int32. Returns [B, C] in mixed's dtype."""
    B, C = mixed.shape
    K = conv_weight.shape[-1]
    assert conv_state.shape[1:] == (C, K - 1) and conv_state.stride(2) == 1 and conv_state.stride(1) == K - 1
    assert mixed.stride(1) == 1
    w = conv_weight.reshape(C, K).contiguous()
    out = torch.empty_like(mixed) if out is None else out
    BLOCK_C = 256
    _conv_update_kernel[(B, triton.cdiv(C, BLOCK_C))](
        mixed, conv_state, w, slot_ids, out, C, mixed.stride(0), conv_state.stride(0), out.stride(0),
        K=K, BLOCK_C=BLOCK_C, BLOCK_K=triton.next_power_of_2(K - 1))
    return out


def gdn_recurrent_update(qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                         dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_state: torch.Tensor,
                         slot_ids: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int,
                         eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """Delta-rule step + gated norm. qkv [B, conv_dim] (post-conv), z [B, HV*dv], a/b [B, HV], ssm_state
    [slots, HV, dk, dv] fp32 (updated in place at slot_ids). Returns y [B, HV*dv] in qkv's dtype."""
    B = qkv.shape[0]
    HV = a.shape[1]
    HK, DK, DV = num_k_heads, head_k_dim, head_v_dim
    assert ssm_state.dtype == torch.float32 and ssm_state.shape[1:] == (HV, DK, DV)
    assert ssm_state[0].is_contiguous() and qkv.stride(1) == 1 and z.stride(1) == 1 and HV % HK == 0
    y = qkv.new_empty(B, HV * DV) if out is None else out
    BK, BV = triton.next_power_of_2(DK), triton.next_power_of_2(DV)
    _recurrent_kernel[(B, HV)](
        qkv, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids, y,
        qkv.stride(0), z.stride(0), a.stride(0), b.stride(0), ssm_state.stride(0), y.stride(0), DK ** -0.5, eps,
        HK=HK, HV=HV, DK=DK, DV=DV, BK=BK, BV=BV, num_warps=8 if BK * BV >= 16384 else 4)
    return y


def gdn_decode(mixed: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_state: torch.Tensor,
               conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
               ssm_state: torch.Tensor, slot_ids: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int,
               eps: float = 1e-6) -> torch.Tensor:
    """The whole GDN decode step between the input projections and out_proj (same contract as
    ``gdn_decode_naive``): conv update, then recurrence + gated norm. Returns y [B, HV*dv]."""
    qkv = gdn_conv_update(mixed, conv_state, conv_weight, slot_ids)
    return gdn_recurrent_update(qkv, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids, num_k_heads,
                                head_k_dim, head_v_dim, eps)
