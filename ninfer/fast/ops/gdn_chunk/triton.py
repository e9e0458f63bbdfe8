"""GDN prefill for one sequence: the causal conv continuing from a window, and the chunked gated delta rule
(qwen35-architecture.md section 2.5) in three passes over chunks of C tokens, then the gated RMSNorm.

1. prep    (chunk, value head), parallel: gamma = in-chunk cumsum of g, beta, and the WY transform
           T = (I + strictly_lower(diag(beta) K K^T * D))^-1, U = T diag(beta) V, W = T diag(beta exp(gamma)) K.
2. state   (value head, dv block), sequential over chunks: V_new = U - W S, S <- exp(gamma_C) S + K_dec^T V_new;
           writes V_new over U and S after every chunk (the checkpoint states; the last is the final state).
3. output  (chunk, value head, dv block), parallel: O = exp(gamma) Q S_in + ((Q K^T) * D) V_new.
q/k are l2-normalised on every load (cheaper than a round trip through memory). All math is fp32, and tl.dot on fp32
operands runs as TF32 on the GPU (3xTF32 bought no accuracy on ill-conditioned chunks and cost 25%).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_prefill_kernel(m_ptr, win_ptr, w_ptr, out_ptr, T, C, stride_m, stride_o,
                         K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    mt = t < T
    mc = c < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for i in tl.static_range(K):
        # tap i reads input t-K+1+i: from m when it is in this call, else from the incoming window
        src = t - (K - 1) + i
        in_m = (src >= 0) & mt
        x_m = tl.load(m_ptr + src[:, None] * stride_m + c[None, :], mask=in_m[:, None] & mc[None, :], other=0.0)
        in_w = (src < 0) & mt
        x_w = tl.load(win_ptr + c[None, :] * (K - 1) + (src + K - 1)[:, None], mask=in_w[:, None] & mc[None, :],
                      other=0.0)
        x = tl.where(in_m[:, None], x_m.to(tl.float32), x_w.to(tl.float32))
        acc += x * tl.load(w_ptr + c * K + i, mask=mc, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + t[:, None] * stride_o + c[None, :], (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty),
             mask=mt[:, None] & mc[None, :])


@triton.jit
def _conv_window_kernel(m_ptr, win_ptr, wout_ptr, T, C, stride_m, K: tl.constexpr, BC: tl.constexpr,
                        BJ: tl.constexpr):
    # the new window is positions T..T+K-2 of cat(window, m): the last K-1 inputs seen
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    j = tl.arange(0, BJ)
    idx = T + j
    mask = (c[:, None] < C) & (j[None, :] < K - 1)
    from_m = tl.load(m_ptr + (idx - (K - 1))[None, :] * stride_m + c[:, None],
                     mask=mask & (idx >= K - 1)[None, :], other=0.0)
    from_w = tl.load(win_ptr + c[:, None] * (K - 1) + idx[None, :], mask=mask & (idx < K - 1)[None, :], other=0.0)
    x = tl.where((idx >= K - 1)[None, :], from_m.to(tl.float32), from_w.to(tl.float32))
    tl.store(wout_ptr + c[:, None] * (K - 1) + j[None, :], x.to(wout_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_qk(qkv_ptr, t, mt, col0, stride_qkv, kk, mk, scale):
    # rows t of one q or k head, l2-normalised in fp32 (eps 1e-6 inside the sqrt) and scaled
    x = tl.load(qkv_ptr + t[:, None] * stride_qkv + col0 + kk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
    x = x.to(tl.float32)
    return x * (scale / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6))[:, None]


@triton.jit
def _chunk_prep_kernel(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, w_ptr, u_ptr,
                       T, stride_qkv, stride_a, stride_b,
                       HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SUB: tl.constexpr):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    o_t = tl.arange(0, BT)
    t = n * BT + o_t
    mt = t < T
    kk = tl.arange(0, BK)
    vv = tl.arange(0, BV)
    k = _load_qk(qkv_ptr, t, mt, HK * DK + hk * DK, stride_qkv, kk, kk < DK, 1.0)  # [BT, BK]
    # gates; padded tail steps get g = 0, beta = 0 so they leave S untouched
    a = tl.load(a_ptr + t * stride_a + hv, mask=mt, other=0.0).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = tl.where(mt, -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus, 0.0)
    beta = tl.where(mt, tl.sigmoid(tl.load(b_ptr + t * stride_b + hv, mask=mt, other=0.0).to(tl.float32)), 0.0)
    gamma = tl.cumsum(g, axis=0)  # [BT]
    tl.store(gam_ptr + t * HV + hv, gamma, mask=mt)
    # A = strictly_lower(diag(beta) K K^T * D), D[r, s] = exp(gamma_r - gamma_s) <= 1 below the diagonal
    lower = o_t[:, None] > o_t[None, :]
    decay = tl.exp(tl.where(lower, gamma[:, None] - gamma[None, :], 0.0))
    A = tl.where(lower, beta[:, None] * tl.dot(k, tl.trans(k)) * decay, 0.0)  # [BT, BT]
    # (I + A)^-1 in two stages over 4 diagonal blocks of BT/4 rows. First the block-diagonal part by forward
    # substitution, one row of every block per step: afterwards L + I = (I + A_diag)^-1.
    blk = o_t // SUB
    same = blk[:, None] == blk[None, :]
    L = tl.where(same, -A, 0.0)
    for i in range(1, SUB):
        step = ((o_t % SUB) == i)[:, None]
        rows = tl.where(step, L, 0.0)
        L = tl.where(step, rows + tl.dot(rows, L, input_precision="tf32"), L)
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    Dinv = L + eye
    # then with N = Dinv A_offdiag (strictly block-lower, so N^4 = 0): (I + A)^-1 = (I - N + N^2 - N^3) Dinv
    N = tl.dot(Dinv, tl.where(same, 0.0, A), input_precision="tf32")
    N2 = tl.dot(N, N, input_precision="tf32")
    Y = eye - N + N2 - tl.dot(N, N2, input_precision="tf32")
    Tm = tl.dot(Y, Dinv, input_precision="tf32")
    W = tl.dot(Tm, k * (beta * tl.exp(gamma))[:, None])  # [BT, BK]
    tl.store(w_ptr + (t[:, None] * HV + hv) * DK + kk[None, :], W, mask=mt[:, None] & (kk < DK)[None, :])
    mv = vv < DV
    v = tl.load(qkv_ptr + t[:, None] * stride_qkv + 2 * HK * DK + hv * DV + vv[None, :],
                mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
    U = tl.dot(Tm, v * beta[:, None])  # [BT, BV]
    tl.store(u_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], U, mask=mt[:, None] & mv[None, :])


@triton.jit
def _chunk_state_kernel(qkv_ptr, gam_ptr, w_ptr, u_ptr, s0_ptr, states_ptr, T, NT, stride_qkv,
                        HAS_S0: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                        DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    hv = tl.program_id(0)
    hk = hv // (HV // HK)
    o_t = tl.arange(0, BT)
    kk = tl.arange(0, BK)
    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    mk = kk < DK
    mv = vv < DV
    s_off = hv * DK * DV + kk[:, None] * DV + vv[None, :]
    smask = mk[:, None] & mv[None, :]
    if HAS_S0:
        S = tl.load(s0_ptr + s_off, mask=smask, other=0.0)  # [BK, BV] fp32
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for n in range(NT):
        t = n * BT + o_t
        mt = t < T
        w = tl.load(w_ptr + (t[:, None] * HV + hv) * DK + kk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        u_ptrs = u_ptr + (t[:, None] * HV + hv) * DV + vv[None, :]
        umask = mt[:, None] & mv[None, :]
        v_new = tl.load(u_ptrs, mask=umask, other=0.0) - tl.dot(w, S)  # [BT, BV]
        tl.store(u_ptrs, v_new, mask=umask)
        k = _load_qk(qkv_ptr, t, mt, HK * DK + hk * DK, stride_qkv, kk, mk, 1.0)
        gamma = tl.load(gam_ptr + t * HV + hv, mask=mt, other=0.0)
        g_last = tl.load(gam_ptr + (tl.minimum(n * BT + BT, T) - 1) * HV + hv)
        k_dec = k * tl.where(mt, tl.exp(g_last - gamma), 0.0)[:, None]
        S = S * tl.exp(g_last) + tl.dot(tl.trans(k_dec), v_new)
        tl.store(states_ptr + n * HV * DK * DV + s_off, S, mask=smask)


@triton.jit
def _chunk_output_kernel(qkv_ptr, gam_ptr, u_ptr, s0_ptr, states_ptr, o_ptr, T, stride_qkv, scale,
                         HAS_S0: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                         DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    o_t = tl.arange(0, BT)
    t = n * BT + o_t
    mt = t < T
    kk = tl.arange(0, BK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    mk = kk < DK
    mv = vv < DV
    q = _load_qk(qkv_ptr, t, mt, hk * DK, stride_qkv, kk, mk, scale)
    k = _load_qk(qkv_ptr, t, mt, HK * DK + hk * DK, stride_qkv, kk, mk, 1.0)
    gamma = tl.load(gam_ptr + t * HV + hv, mask=mt, other=0.0)
    # the state entering chunk n is the one stored after chunk n-1 (or the initial state)
    s_off = hv * DK * DV + kk[:, None] * DV + vv[None, :]
    smask = mk[:, None] & mv[None, :]
    if n > 0:
        S = tl.load(states_ptr + (n - 1) * HV * DK * DV + s_off, mask=smask, other=0.0)
    elif HAS_S0:
        S = tl.load(s0_ptr + s_off, mask=smask, other=0.0)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    causal = o_t[:, None] >= o_t[None, :]
    att = tl.where(causal, tl.dot(q, tl.trans(k)) * tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :], 0.0)),
                   0.0)  # [BT, BT]
    v_new = tl.load(u_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], mask=mt[:, None] & mv[None, :], other=0.0)
    o = tl.exp(gamma)[:, None] * tl.dot(q, S) + tl.dot(att, v_new)
    tl.store(o_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], o, mask=mt[:, None] & mv[None, :])


@triton.jit
def _gated_norm_kernel(o_ptr, z_ptr, nw_ptr, y_ptr, stride_z, stride_y, eps,
                       HV: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr):
    # one token, all its value heads: y = w * o / rms(o) * silu(z) per head
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BH)
    vv = tl.arange(0, BV)
    mask = (h < HV)[:, None] & (vv < DV)[None, :]
    col = h[:, None] * DV + vv[None, :]
    o = tl.load(o_ptr + t * HV * DV + col, mask=mask, other=0.0)  # [BH, BV]
    z = tl.load(z_ptr + t * stride_z + col, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(nw_ptr + vv, mask=vv < DV, other=0.0).to(tl.float32)
    y = o / tl.sqrt(tl.sum(o * o, axis=1) / DV + eps)[:, None] * w[None, :] * (z * tl.sigmoid(z))
    tl.store(y_ptr + t * stride_y + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def gdn_conv_prefill(m: torch.Tensor, window: torch.Tensor, conv_weight: torch.Tensor,
                     out: torch.Tensor | None = None,
                     window_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(causal depthwise conv) over m [T, C] continuing from window [C, K-1]; conv_weight [C, 1, K] or [C, K].
    Returns (out [T, C], the window after the last token [C, K-1]); ``window_out`` may alias ``window``."""
    T, C = m.shape
    K = conv_weight.shape[-1]
    assert m.stride(1) == 1 and window.is_contiguous() and window.shape == (C, K - 1)
    w = conv_weight.reshape(C, K).contiguous()
    out = torch.empty_like(m) if out is None else out
    window_out = torch.empty_like(window) if window_out is None else window_out
    # the window kernel may overwrite the window the conv kernel still reads
    src = window.clone() if window_out.data_ptr() == window.data_ptr() else window
    BT, BC = 32, 128
    _conv_prefill_kernel[(triton.cdiv(T, BT), triton.cdiv(C, BC))](
        m, src, w, out, T, C, m.stride(0), out.stride(0), K=K, BT=BT, BC=BC)
    _conv_window_kernel[(triton.cdiv(C, BC),)](
        m, src, window_out, T, C, m.stride(0), K=K, BC=BC, BJ=triton.next_power_of_2(K - 1))
    return out, window_out


def gdn_chunk(qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor, norm_weight: torch.Tensor, initial_state: torch.Tensor | None,
              num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
              chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule + gated RMSNorm for one sequence (same contract as ``gdn_chunk_naive``).

    qkv [T, conv_dim] post-conv, z [T, HV*dv], a/b [T, HV], initial_state [HV, dk, dv] fp32 or None.
    Returns (y [T, HV*dv] in qkv's dtype, states [ceil(T/C), HV, dk, dv] fp32, S after each chunk; states[-1] is
    the final state). Chunks are aligned to this call's first token.
    """
    T = qkv.shape[0]
    HV = a.shape[1]
    HK, DK, DV = num_k_heads, head_k_dim, head_v_dim
    assert qkv.stride(1) == 1 and z.stride(1) == 1 and HV % HK == 0 and qkv.shape[1] == 2 * HK * DK + HV * DV
    assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0
    BT = chunk_size
    NT = triton.cdiv(T, BT)
    BK, BV_full = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    BV = min(BV_full, 32)
    f32 = dict(device=qkv.device, dtype=torch.float32)
    gam = torch.empty(T, HV, **f32)  # in-chunk cumulative log decay
    w, u = torch.empty(T, HV, DK, **f32), torch.empty(T, HV, DV, **f32)
    states = torch.empty(NT, HV, DK, DV, **f32)
    o = torch.empty(T, HV, DV, **f32)
    has_s0 = initial_state is not None
    if has_s0:
        assert initial_state.dtype == torch.float32 and initial_state.is_contiguous()
    s0 = initial_state if has_s0 else states
    dims = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=BT, BK=BK)
    _chunk_prep_kernel[(NT, HV)](qkv, a, b, A_log, dt_bias, gam, w, u, T, qkv.stride(0), a.stride(0),
                                 b.stride(0), **dims, BV=BV_full, SUB=BT // 4, num_warps=4)
    _chunk_state_kernel[(HV, triton.cdiv(DV, BV))](qkv, gam, w, u, s0, states, T, NT, qkv.stride(0),
                                                   HAS_S0=has_s0, **dims, BV=BV, num_warps=8)
    BV_o = min(BV_full, 64)
    _chunk_output_kernel[(NT, HV, triton.cdiv(DV, BV_o))](qkv, gam, u, s0, states, o, T, qkv.stride(0), DK ** -0.5,
                                                          HAS_S0=has_s0, **dims, BV=BV_o, num_warps=8)
    y = qkv.new_empty(T, HV * DV)
    _gated_norm_kernel[(T,)](o, z, norm_weight, y, z.stride(0), y.stride(0), eps, HV=HV, DV=DV,
                             BH=triton.next_power_of_2(HV), BV=BV_full, num_warps=4)
    return y, states
