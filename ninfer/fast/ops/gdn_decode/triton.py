"""GDN decode step in one launch: the conv-window update, the delta-rule recurrence fused with the gates, the q/k
l2norm and the gated RMSNorm, one program per (row, value head, 32-wide dv block). The norm needs whole rows of o,
so the last program of a key head to arrive (an atomic counter) finishes them. ``gdn_conv_update`` keeps the conv
alone as its own kernel. Every sequence reads its conv/SSM state slot through ``slot_ids`` and writes the stepped
window and S to ``out_slot_ids`` (by default the same slot: in place; the verify pass writes each block position's
state into a slot of its own, docs/speculative.md); a negative read id (a CUDA-graph padding row) reads a zero state,
a negative out id writes no state. With ``rows`` sequence i's inputs and output are row rows[i] of the packed
tensors: the verify pass steps its blocks' token rows without gathering them and scattering the output back (five
index kernels a step and layer: 1.27 of the 9B verify graph's 8.7 ms on the H100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _conv_update_kernel(x_ptr, state_ptr, w_ptr, slot_ptr, out_ptr, C, stride_x, stride_slot, stride_o,
                        K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
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
def _conv_channels(x_row, win_row, w_ptr, ch, mch, mwin, K: tl.constexpr):
    # silu(conv) of channels ch for one new input: taps = window [ch, K-1] (read where mwin) then x.
    # Rounded through the io dtype, like the stored output of an unfused conv. [len(ch)] fp32. Tap by tap on
    # vectors, so no 2D layout reaches the state tile's products
    x = tl.load(x_row + ch, mask=mch, other=0.0)
    acc = x.to(tl.float32) * tl.load(w_ptr + ch * K + K - 1, mask=mch, other=0.0).to(tl.float32)
    for j in tl.static_range(K - 1):
        win = tl.load(win_row + ch * (K - 1) + j, mask=mwin, other=0.0).to(tl.float32)
        acc += win * tl.load(w_ptr + ch * K + j, mask=mch, other=0.0).to(tl.float32)
    return (acc * tl.sigmoid(acc)).to(x.dtype).to(tl.float32)


@triton.jit
def _shift_window(x_row, win_row, out_row, ch, mch, live, K: tl.constexpr, BKW: tl.constexpr):
    # out window [ch, K-1] <- [window[:, 1:], x] (an empty window where not live); loads all land before any
    # thread stores (the barrier), because in place a thread may store an element another thread still has to read
    j = tl.arange(0, BKW)
    offs = ch[:, None] * (K - 1) + j[None, :]
    shifted = tl.load(win_row + offs + 1, mask=mch[:, None] & (j < tl.where(live, K - 2, 0))[None, :], other=0.0)
    x = tl.load(x_row + ch, mask=mch, other=0.0)
    new = tl.where((j == K - 2)[None, :], x[:, None].to(shifted.dtype), shifted)
    tl.debug_barrier()
    tl.store(out_row + offs, new, mask=mch[:, None] & (j < K - 1)[None, :])


@triton.jit
def _gated_norm_group(o_ptr, z_ptr, nw_ptr, y_ptr, b, r, hk, stride_z, stride_y, eps,
                      HV: tl.constexpr, DV: tl.constexpr, G: tl.constexpr, BVF: tl.constexpr):
    # y = w * o / rms(o) * silu(z) for the G value heads of key head hk, reading the fp32 o rows every program
    # of sequence b wrote (.cg: from L2, where the other programs' stores are); z and y at packed row r
    vv = tl.arange(0, BVF)
    mv = vv < DV
    w = tl.load(nw_ptr + vv, mask=mv, other=0.0).to(tl.float32)
    for j in tl.static_range(G):
        hv = hk * G + j
        o = tl.load(o_ptr + (b * HV + hv) * DV + vv, mask=mv, other=0.0, cache_modifier=".cg")
        rstd = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / DV + eps)
        z = tl.load(z_ptr + r * stride_z + hv * DV + vv, mask=mv, other=0.0).to(tl.float32)
        y = o * rstd * w * (z * tl.sigmoid(z))
        tl.store(y_ptr + r * stride_y + hv * DV + vv, y.to(y_ptr.dtype.element_ty), mask=mv)


@triton.jit
def _recurrent_kernel(x_ptr, conv_ptr, cw_ptr, z_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, nw_ptr, s_ptr, slot_ptr,
                      out_slot_ptr, row_ptr, o_ptr, cnt_ptr, y_ptr, stride_x, stride_conv, stride_z, stride_a,
                      stride_b, stride_slot, stride_y, scale, eps, HK: tl.constexpr, HV: tl.constexpr,
                      DK: tl.constexpr, DV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, CONV: tl.constexpr,
                      ROWS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, BVF: tl.constexpr,
                      BKW: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    # program (b, value head, dv block): columns of S are independent in the delta rule, so S [dk, BV] is this
    # program's alone; q/k (and with CONV their conv) are recomputed by each of the G * NV programs of a key head.
    # Sequence b's inputs and output are row r of x/z/a/b/y (ROWS: rows[b]); o and the counters are b's
    b = tl.program_id(0)
    r = tl.load(row_ptr + b).to(tl.int64) if ROWS else b.to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // G  # G = HV // HK value heads per key head
    slot = tl.load(slot_ptr + b).to(tl.int64)
    out = tl.load(out_slot_ptr + b).to(tl.int64)
    live = slot >= 0
    kept = out >= 0  # whether the stepped state is written anywhere
    kk = tl.arange(0, BK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    mk = kk < DK
    mv = vv < DV
    # gates in fp32; softplus uses torch's threshold of 20
    a = tl.load(a_ptr + r * stride_a + hv).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus
    beta = tl.sigmoid(tl.load(b_ptr + r * stride_b + hv).to(tl.float32))
    # the decayed state block before the conv: its DRAM latency overlaps the conv and the q/k norms.
    # A padding row starts from a zero state and writes none
    s_ptrs = s_ptr + slot * stride_slot + hv * DK * DV + kk[:, None] * DV + vv[None, :]
    smask = (kk < tl.where(live, DK, 0))[:, None] & mv[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0) * tl.exp(g)  # [BK, BV] fp32
    x_row = x_ptr + r * stride_x
    win_row = conv_ptr + slot * stride_conv
    out_row = conv_ptr + out * stride_conv
    q, k, v = _load_qkv(x_row, win_row, cw_ptr, hk, hv, kk, vv, mk, mv, live, HK, DK, DV, K, CONV)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    u = beta * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
    S += k[:, None] * u[None, :]
    out_ptrs = s_ptr + out * stride_slot + hv * DK * DV + kk[:, None] * DV + vv[None, :]
    tl.store(out_ptrs, S, mask=(kk < tl.where(kept, DK, 0))[:, None] & mv[None, :])
    tl.store(o_ptr + (b * HV + hv) * DV + vv, tl.sum(S * q[:, None], axis=0), mask=mv)  # o block, pre-norm
    if CONV:
        if kept:
            _shift_window(x_row, win_row, out_row, 2 * HK * DK + hv * DV + vv, mv, live, K, BKW)
    _finish_on_last_arrival(x_row, win_row, out_row, o_ptr, z_ptr, nw_ptr, y_ptr, cnt_ptr, b, r, hk, kk, mk, live,
                            kept, stride_z, stride_y, eps, HK, HV, DK, DV, G, K, CONV, NV, BVF, BKW)


@triton.jit
def _load_qkv(x_row, win_row, cw_ptr, hk, hv, kk, vv, mk, mv, live, HK: tl.constexpr, DK: tl.constexpr,
              DV: tl.constexpr, K: tl.constexpr, CONV: tl.constexpr):
    # q, k [BK] of key head hk and v [BV] of this dv block, fp32, from the post-conv row or (CONV) through the conv
    if CONV:
        # a padding row (slot < 0) sees an empty window (the limit trick keeps masks as tensors)
        wk = kk < tl.where(live, DK, 0)
        wv = vv < tl.where(live, DV, 0)
        q = _conv_channels(x_row, win_row, cw_ptr, hk * DK + kk, mk, wk, K)
        k = _conv_channels(x_row, win_row, cw_ptr, (HK + hk) * DK + kk, mk, wk, K)
        v = _conv_channels(x_row, win_row, cw_ptr, 2 * HK * DK + hv * DV + vv, mv, wv, K)
    else:
        q = tl.load(x_row + hk * DK + kk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(x_row + (HK + hk) * DK + kk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(x_row + 2 * HK * DK + hv * DV + vv, mask=mv, other=0.0).to(tl.float32)
    return q, k, v


@triton.jit
def _finish_on_last_arrival(x_row, win_row, out_row, o_ptr, z_ptr, nw_ptr, y_ptr, cnt_ptr, b, r, hk, kk, mk, live,
                            kept, stride_z, stride_y, eps, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                            DV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, CONV: tl.constexpr, NV: tl.constexpr,
                            BVF: tl.constexpr, BKW: tl.constexpr):
    # the last of the key head's G * NV programs to arrive normalises its G rows of o (the norm needs whole rows)
    # and moves the shared q/k windows, which every other program has read by then; it leaves the counter at 0.
    # The barrier puts all of this program's o stores before the (acq_rel, gpu-scope) arrival.
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + b * HK + hk, 1)
    if arrived == G * NV - 1:
        tl.debug_barrier()
        _gated_norm_group(o_ptr, z_ptr, nw_ptr, y_ptr, b, r, hk, stride_z, stride_y, eps, HV, DV, G, BVF)
        if CONV:
            if kept:
                _shift_window(x_row, win_row, out_row, hk * DK + kk, mk, live, K, BKW)
                _shift_window(x_row, win_row, out_row, (HK + hk) * DK + kk, mk, live, K, BKW)
        tl.atomic_xchg(cnt_ptr + b * HK + hk, 0)


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
    on = pdl.active(mixed)
    _conv_update_kernel[(B, triton.cdiv(C, BLOCK_C))](
        mixed, conv_state, w, slot_ids, out, C, mixed.stride(0), conv_state.stride(0), out.stride(0),
        K=K, BLOCK_C=BLOCK_C, BLOCK_K=triton.next_power_of_2(K - 1), PDL=on, **pdl.launch(on))
    return out


_ARRIVALS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor | None] = []


def _arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """Per-(row, key head) arrival counters, zeroed once: every launch leaves them at zero again. NOTE: shared by
    all launches on a device, so two decode kernels must not run concurrently on different streams."""
    buf = _ARRIVALS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gdn_decode: run a launch of this batch size once before CUDA-graph capture (it "
                               "allocates its arrival counters)")
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        # a replaced buffer may still be baked into captured graphs: it stays allocated for the process
        _RETIRED.append(_ARRIVALS.get(device))
        _ARRIVALS[device] = buf
    return buf


def _launch(x, conv_state, conv_weight, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids, HK, DK, DV,
            eps, out, out_slot_ids=None, rows=None):
    B = x.shape[0] if rows is None else rows.shape[0]
    HV = a.shape[1]
    assert ssm_state.dtype == torch.float32 and ssm_state.shape[1:] == (HV, DK, DV)
    assert ssm_state[0].is_contiguous() and x.stride(1) == 1 and z.stride(1) == 1 and HV % HK == 0
    assert rows is None or out is not None, "with rows the output rows land in out"
    y = x.new_empty(B, HV * DV) if out is None else out
    o = torch.empty(B, HV, DV, device=x.device, dtype=torch.float32)  # pre-norm outputs
    conv = conv_state is not None
    K = conv_weight.shape[-1] if conv else 1
    w = conv_weight.reshape(-1, K).contiguous() if conv else x
    BK, BVF = triton.next_power_of_2(DK), triton.next_power_of_2(DV)
    # dv blocks of 32 (128-byte rows of S): 4 programs per head at dv=128, so B=1 already spreads over ~128 SMs
    BV = min(BVF, 32)
    NV = triton.cdiv(DV, BV)
    on = pdl.active(x)
    _recurrent_kernel[(B, HV, NV)](
        x, conv_state if conv else x, w, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids,
        slot_ids if out_slot_ids is None else out_slot_ids, slot_ids if rows is None else rows, o,
        _arrival_counters(x.device, B * HK), y, x.stride(0), conv_state.stride(0) if conv else 0, z.stride(0),
        a.stride(0), b.stride(0), ssm_state.stride(0), y.stride(0), DK ** -0.5, eps,
        HK=HK, HV=HV, DK=DK, DV=DV, G=HV // HK, K=K, CONV=conv, ROWS=rows is not None, BK=BK, BV=BV, NV=NV, BVF=BVF,
        BKW=triton.next_power_of_2(K), PDL=on, num_warps=4, **pdl.launch(on))
    return y


def gdn_recurrent_update(qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                         dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_state: torch.Tensor,
                         slot_ids: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int,
                         eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """Delta-rule step + gated norm. qkv [B, conv_dim] (post-conv), z [B, HV*dv], a/b [B, HV], ssm_state
    [slots, HV, dk, dv] fp32 (updated in place at slot_ids). Returns y [B, HV*dv] in qkv's dtype."""
    return _launch(qkv, None, None, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids, num_k_heads,
                   head_k_dim, head_v_dim, eps, out)


def gdn_decode(mixed: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_state: torch.Tensor,
               conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
               ssm_state: torch.Tensor, slot_ids: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int,
               eps: float = 1e-6, out_slot_ids: torch.Tensor | None = None, rows: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The whole GDN decode step between the input projections and out_proj (same contract as
    ``gdn_decode_naive``, ``out_slot_ids``, ``rows`` and ``out`` included) in one launch: conv update, recurrence,
    gated norm. Returns y [B, HV*dv] (with ``rows``: ``out``)."""
    C, K = mixed.shape[1], conv_weight.shape[-1]
    assert conv_state.shape[1:] == (C, K - 1) and conv_state.stride(2) == 1 and conv_state.stride(1) == K - 1
    return _launch(mixed, conv_state, conv_weight, z, a, b, A_log, dt_bias, norm_weight, ssm_state, slot_ids,
                   num_k_heads, head_k_dim, head_v_dim, eps, out, out_slot_ids, rows)
