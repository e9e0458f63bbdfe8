"""The GDN decode recurrence over the verify pass's blocks in one launch per layer: each program (block b, value
head, 32-wide dv block) loads its S block and its channels' conv windows once, then walks the block's tokens with
both in registers, leaving each step's S and window in that step's out slot. The per-step path (``gdn_decode`` once
per block position) launches W times a layer and re-reads the state each step: 96 launches for a 9B MTP block of 4,
384 for a DFlash block of 16 (the 9B MTP verify graph's recurrence took 680 us against 194 us in a decode step,
H100, twelfth session).

Same math as ``gdn_decode``'s kernel, step after step: conv (the window carried as K - 1 = 3 register vectors per
channel group, so only K = 4 is built), l2-normalised q/k, the gates, the delta rule, o = S^T q, then the gated
RMSNorm by the last program of a key head to arrive at that step (an atomic counter per (block, step, key head)),
which also stores the step's q/k windows (every program of the key head has read the slot's windows by then, and
each program stores its own S block and v windows). Steps past a block's length are not run: their rows of ``out``
keep their values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl

# one zeroed counter buffer per device for both ops (each launch leaves it at zero; the two never run concurrently)
from ninfer.fast.ops.gdn_decode.triton import _arrival_counters, _gated_norm_group

CONV_TAPS = 4  # the conv kernel width this kernel is built for (Qwen3.5's linear_conv_kernel_dim)


@triton.jit
def _window(win_row, ch, mwin):
    # the K - 1 = 3 window taps of channels ch, oldest first, fp32 (zeros where not mwin)
    w0 = tl.load(win_row + ch * 3, mask=mwin, other=0.0).to(tl.float32)
    w1 = tl.load(win_row + ch * 3 + 1, mask=mwin, other=0.0).to(tl.float32)
    w2 = tl.load(win_row + ch * 3 + 2, mask=mwin, other=0.0).to(tl.float32)
    return w0, w1, w2


@triton.jit
def _taps(w_ptr, ch, mch):
    # the 4 conv weights of channels ch, fp32
    t0 = tl.load(w_ptr + ch * 4, mask=mch, other=0.0).to(tl.float32)
    t1 = tl.load(w_ptr + ch * 4 + 1, mask=mch, other=0.0).to(tl.float32)
    t2 = tl.load(w_ptr + ch * 4 + 2, mask=mch, other=0.0).to(tl.float32)
    t3 = tl.load(w_ptr + ch * 4 + 3, mask=mch, other=0.0).to(tl.float32)
    return t0, t1, t2, t3


@triton.jit
def _store_window(row, ch, mch, w0, w1, w2):
    tl.store(row + ch * 3, w0.to(row.dtype.element_ty), mask=mch)
    tl.store(row + ch * 3 + 1, w1.to(row.dtype.element_ty), mask=mch)
    tl.store(row + ch * 3 + 2, w2.to(row.dtype.element_ty), mask=mch)


@triton.jit
def _silu_io(acc, like):
    # silu of the conv sum, rounded through the io dtype like the stored output of an unfused conv
    return (acc * tl.sigmoid(acc)).to(like.dtype).to(tl.float32)


@triton.jit
def _verify_kernel(x_ptr, conv_ptr, cw_ptr, z_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, nw_ptr, s_ptr, slot_ptr,
                   cu_ptr, outs_ptr, o_ptr, cnt_ptr, y_ptr, stride_x, stride_conv, stride_z, stride_a, stride_b,
                   stride_slot, stride_y, stride_outs, scale, eps, W: tl.constexpr, HK: tl.constexpr,
                   HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, G: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, NV: tl.constexpr, BVF: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    blk = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // G
    start = tl.load(cu_ptr + blk).to(tl.int64)
    n = tl.load(cu_ptr + blk + 1).to(tl.int64) - start
    slot = tl.load(slot_ptr + blk).to(tl.int64)
    live = slot >= 0
    kk = tl.arange(0, BK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    mk = kk < DK
    mv = vv < DV
    qch, kch, vch = hk * DK + kk, (HK + hk) * DK + kk, 2 * HK * DK + hv * DV + vv
    # the state before the block: S block and the windows of this program's channels (zeros for a padding block)
    S = tl.load(s_ptr + slot * stride_slot + hv * DK * DV + kk[:, None] * DV + vv[None, :],
                mask=(kk < tl.where(live, DK, 0))[:, None] & mv[None, :], other=0.0)  # [BK, BV] fp32
    win_row = conv_ptr + slot * stride_conv
    wk = kk < tl.where(live, DK, 0)
    q0, q1, q2 = _window(win_row, qch, wk)
    k0, k1, k2 = _window(win_row, kch, wk)
    v0, v1, v2 = _window(win_row, vch, vv < tl.where(live, DV, 0))
    qt0, qt1, qt2, qt3 = _taps(cw_ptr, qch, mk)
    kt0, kt1, kt2, kt3 = _taps(cw_ptr, kch, mk)
    vt0, vt1, vt2, vt3 = _taps(cw_ptr, vch, mv)
    A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dtb = tl.load(dtb_ptr + hv).to(tl.float32)
    for j in range(0, n):
        r = start + j
        out = tl.load(outs_ptr + j * stride_outs + blk).to(tl.int64)
        kept = out >= 0
        a = tl.load(a_ptr + r * stride_a + hv).to(tl.float32) + dtb
        g = A * tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))  # softplus, torch's threshold
        beta = tl.sigmoid(tl.load(b_ptr + r * stride_b + hv).to(tl.float32))
        x_row = x_ptr + r * stride_x
        xq = tl.load(x_row + qch, mask=mk, other=0.0)
        xk = tl.load(x_row + kch, mask=mk, other=0.0)
        xv = tl.load(x_row + vch, mask=mv, other=0.0)
        q = _silu_io(qt0 * q0 + qt1 * q1 + qt2 * q2 + qt3 * xq.to(tl.float32), xq)
        k = _silu_io(kt0 * k0 + kt1 * k1 + kt2 * k2 + kt3 * xk.to(tl.float32), xk)
        v = _silu_io(vt0 * v0 + vt1 * v1 + vt2 * v2 + vt3 * xv.to(tl.float32), xv)
        q0, q1, q2 = q1, q2, xq.to(tl.float32)
        k0, k1, k2 = k1, k2, xk.to(tl.float32)
        v0, v1, v2 = v1, v2, xv.to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
        S += k[:, None] * u[None, :]
        tl.store(s_ptr + out * stride_slot + hv * DK * DV + kk[:, None] * DV + vv[None, :], S,
                 mask=(kk < tl.where(kept, DK, 0))[:, None] & mv[None, :])
        out_row = conv_ptr + out * stride_conv
        _store_window(out_row, vch, vv < tl.where(kept, DV, 0), v0, v1, v2)
        step = blk * W + j  # the (block, step) row of o and of the counters
        tl.store(o_ptr + (step * HV + hv) * DV + vv, tl.sum(S * q[:, None], axis=0), mask=mv)  # pre-norm
        # the last program of the key head to arrive normalises its G rows of o and stores the q/k windows; the
        # barrier puts this program's stores before its (acq_rel, gpu-scope) arrival
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + step * HK + hk, 1)
        if arrived == G * NV - 1:
            tl.debug_barrier()
            _gated_norm_group(o_ptr, z_ptr, nw_ptr, y_ptr, step, r, hk, stride_z, stride_y, eps, HV, DV, G, BVF)
            wq = kk < tl.where(kept, DK, 0)
            _store_window(out_row, qch, wq, q0, q1, q2)
            _store_window(out_row, kch, wq, k0, k1, k2)
            tl.atomic_xchg(cnt_ptr + step * HK + hk, 0)


def gdn_verify(mixed: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_state: torch.Tensor,
               conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
               ssm_state: torch.Tensor, slot_ids: torch.Tensor, cu: torch.Tensor, out_slots: torch.Tensor,
               num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``gdn_verify_naive``'s contract in one launch (graph-safe: the block lengths are read on the device). Only a
    conv of CONV_TAPS taps is built (``supports``)."""
    B, (N, C), K = cu.shape[0] - 1, mixed.shape, conv_weight.shape[-1]
    HK, DK, DV, HV, W = num_k_heads, head_k_dim, head_v_dim, a.shape[1], out_slots.shape[0]
    assert K == CONV_TAPS and conv_state.shape[1:] == (C, K - 1) and conv_state.stride(2) == 1 and \
        conv_state.stride(1) == K - 1
    assert ssm_state.dtype == torch.float32 and ssm_state.shape[1:] == (HV, DK, DV) and ssm_state[0].is_contiguous()
    assert mixed.stride(1) == 1 and z.stride(1) == 1 and out_slots.stride(1) == 1 and HV % HK == 0
    out = mixed.new_zeros(N, HV * DV) if out is None else out
    o = torch.empty(B * W, HV, DV, device=mixed.device, dtype=torch.float32)  # pre-norm outputs per step
    BK, BVF = triton.next_power_of_2(DK), triton.next_power_of_2(DV)
    BV = min(BVF, 32)
    NV = triton.cdiv(DV, BV)
    on = pdl.active(mixed)
    _verify_kernel[(B, HV, NV)](
        mixed, conv_state, conv_weight.reshape(C, K).contiguous(), z, a, b, A_log, dt_bias, norm_weight, ssm_state,
        slot_ids, cu, out_slots, o, _arrival_counters(mixed.device, B * W * HK), out, mixed.stride(0),
        conv_state.stride(0), z.stride(0), a.stride(0), b.stride(0), ssm_state.stride(0), out.stride(0),
        out_slots.stride(0), DK ** -0.5, eps, W=W, HK=HK, HV=HV, DK=DK, DV=DV, G=HV // HK, BK=BK, BV=BV, NV=NV,
        BVF=BVF, PDL=on, num_warps=4, **pdl.launch(on))
    return out


def supports(conv_weight: torch.Tensor) -> bool:
    """Whether ``gdn_verify`` is built for this layer's conv."""
    return conv_weight.shape[-1] == CONV_TAPS
