"""GDN prefill for one sequence: the chunked gated delta rule (qwen35-architecture.md section 2.5) in three passes
over chunks of C tokens, then the gated RMSNorm (the causal conv before it is ``conv.py``'s).

1. prep    (chunk, value head), parallel: gamma = in-chunk cumsum of g, beta, and the WY transform
           T = (I + strictly_lower(diag(beta) K K^T * D))^-1, U = T diag(beta) V, W = T diag(beta exp(gamma)) K,
           and kd = the l2norm x decay-to-chunk-end scale of each key row.
2. state   (value head, dv block), sequential over chunks: V_new = U - W S, S <- exp(gamma_C) S + K^T (kd V_new);
           writes V_new (into the o buffer) and S after every chunk (the checkpoint states; the last is the final
           state).
3. output  (chunk, value head, dv block), parallel: O = exp(gamma) Q S_in + ((Q K^T) * D) V_new, over V_new.
Chunks are BT tokens from the call's first token; with ``cuts`` (``VAR``) they restart at every cut, read from a
host-built table of chunk starts, so a checkpoint inside a prefill piece is one of the chunk states (no second
call). q/k are l2-normalised on every load (cheaper than a round trip through memory). All math is fp32, and tl.dot on fp32
operands runs as TF32 on the GPU (3xTF32 bought no accuracy on ill-conditioned chunks and cost 25%).
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from ninfer.fast.hostcopy import to_device

from .naive import chunk_ends


@triton.jit
def _chunk_span(cu_ptr, n, T, BT: tl.constexpr, VAR: tl.constexpr):
    # [t0, t1) of chunk n: BT tokens from the start, or (VAR) the host's table of chunk starts cu [NT + 1]
    if VAR:
        t0 = tl.load(cu_ptr + n)
        t1 = tl.load(cu_ptr + n + 1)
    else:
        t0 = n * BT
        t1 = tl.minimum(t0 + BT, T)
    return t0, t1


@triton.jit
def _load_rows(qkv_ptr, t, mt, col0, stride_qkv, KB: tl.constexpr, kb: tl.constexpr, DK: tl.constexpr):
    # columns [kb*KB, (kb+1)*KB) of one q/k head for rows t, in fp32: [BT, KB]
    kk = kb * KB + tl.arange(0, KB)
    x = tl.load(qkv_ptr + t[:, None] * stride_qkv + col0 + kk[None, :], mask=mt[:, None] & (kk < DK)[None, :],
                other=0.0)
    return x.to(tl.float32)


@triton.jit
def _chunk_prep_kernel(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, kd_ptr, w_ptr, u_ptr, cu_ptr, len_ptr,
                       T, stride_qkv, stride_a, stride_b,
                       HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                       KB: tl.constexpr, NKB: tl.constexpr, VB: tl.constexpr, NVB: tl.constexpr,
                       SUB: tl.constexpr, VAR: tl.constexpr, LEN: tl.constexpr):
    # LEN: rows past the device length are padding, masked as a short last chunk's tail (a chunk wholly past it
    # stores nothing)
    if LEN:
        T = tl.minimum(T, tl.load(len_ptr))
    n = tl.program_id(0)
    hv = tl.program_id(1)
    k_col = HK * DK + (hv // (HV // HK)) * DK
    o_t = tl.arange(0, BT)
    t0, t1 = _chunk_span(cu_ptr, n, T, BT, VAR)
    t = t0 + o_t
    mt = t < t1
    # gates; padded tail steps get g = 0, beta = 0 so they leave S untouched
    a = tl.load(a_ptr + t * stride_a + hv, mask=mt, other=0.0).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = tl.where(mt, -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus, 0.0)
    beta = tl.where(mt, tl.sigmoid(tl.load(b_ptr + t * stride_b + hv, mask=mt, other=0.0).to(tl.float32)), 0.0)
    gamma = tl.cumsum(g, axis=0)  # [BT]
    tl.store(gam_ptr + t * HV + hv, gamma, mask=mt)
    # raw K K^T and the squared row norms in one pass over dk blocks; the l2norm is applied afterwards
    kkt = tl.zeros([BT, BT], dtype=tl.float32)
    kn2 = tl.zeros([BT], dtype=tl.float32)
    for kb in tl.static_range(NKB):
        k = _load_rows(qkv_ptr, t, mt, k_col, stride_qkv, KB, kb, DK)
        kkt += tl.dot(k, tl.trans(k))
        kn2 += tl.sum(k * k, axis=1)
    rk = 1.0 / tl.sqrt(kn2 + 1e-6)
    # the state pass's per-row key scale: l2norm and the decay to the chunk end (padded rows add g = 0, so the
    # last row's gamma is the chunk's)
    g_last = tl.sum(tl.where(o_t == BT - 1, gamma, 0.0), axis=0)
    tl.store(kd_ptr + t * HV + hv, rk * tl.exp(g_last - gamma), mask=mt)
    # A = strictly_lower(diag(beta) K K^T * D), D[r, s] = exp(gamma_r - gamma_s) <= 1 below the diagonal
    lower = o_t[:, None] > o_t[None, :]
    decay = tl.exp(tl.where(lower, gamma[:, None] - gamma[None, :], 0.0))
    A = tl.where(lower, (beta * rk)[:, None] * kkt * rk[None, :] * decay, 0.0)  # [BT, BT]
    # (I + A)^-1 in two stages over 4 diagonal blocks of BT/4 rows. First the block-diagonal part by forward
    # substitution, one row of every block per step: afterwards L + I = (I + A_diag)^-1.
    blk = o_t // SUB
    same = blk[:, None] == blk[None, :]
    L = tl.where(same, -A, 0.0)
    for i in range(1, SUB):
        step = ((o_t % SUB) == i)[:, None]
        rows = tl.where(step, L, 0.0)
        L = tl.where(step, rows + tl.dot(rows, L), L)
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    Dinv = L + eye
    # then with N = Dinv A_offdiag (strictly block-lower, so N^4 = 0): (I + A)^-1 = (I - N + N^2 - N^3) Dinv
    N = tl.dot(Dinv, tl.where(same, 0.0, A))
    N2 = tl.dot(N, N)
    Tm = tl.dot(eye - N + N2 - tl.dot(N, N2), Dinv)
    w_scale = (rk * beta * tl.exp(gamma))[:, None]
    for kb in tl.static_range(NKB):
        kk = kb * KB + tl.arange(0, KB)
        W = tl.dot(Tm, _load_rows(qkv_ptr, t, mt, k_col, stride_qkv, KB, kb, DK) * w_scale)  # [BT, KB]
        tl.store(w_ptr + (t[:, None] * HV + hv) * DK + kk[None, :], W, mask=mt[:, None] & (kk < DK)[None, :])
    for vb in tl.static_range(NVB):
        vv = vb * VB + tl.arange(0, VB)
        vmask = mt[:, None] & (vv < DV)[None, :]
        v = tl.load(qkv_ptr + t[:, None] * stride_qkv + 2 * HK * DK + hv * DV + vv[None, :], mask=vmask, other=0.0)
        U = tl.dot(Tm, v.to(tl.float32) * beta[:, None])  # [BT, VB]
        tl.store(u_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], U, mask=vmask)


@triton.jit
def _chunk_state_kernel(qkv_ptr, gam_ptr, kd_ptr, w_ptr, u_ptr, states_ptr, vn_ptr, cu_ptr, len_ptr, final_ptr, T,
                        NT, stride_qkv,
                        HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, VAR: tl.constexpr, LEN: tl.constexpr,
                        FINAL: tl.constexpr):
    # program (value head, dv block), sequential over chunks with S [BK, BV] in registers: two dots a chunk,
    # V_new = U - W S and S = e^gamma_C S + K^T (kd * V_new), kd = the prep pass's l2norm x decay row scale.
    # Reads U and states[0], writes V_new (to vn) and states[1:]: rerunning it gives the same result (autotuning).
    # LEN: only the chunks of the device length's rows are walked; FINAL: the last S also goes to final_ptr
    if LEN:
        T = tl.minimum(T, tl.load(len_ptr))
        NT = tl.cdiv(T, BT)
    hv = tl.program_id(0)
    k_col = HK * DK + (hv // (HV // HK)) * DK
    o_t = tl.arange(0, BT)
    kk = tl.arange(0, BK)
    mk = kk < DK
    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    mv = vv < DV
    STATE = HV * DK * DV
    s_off = hv * DK * DV + kk[:, None] * DV + vv[None, :]
    s_mask = mk[:, None] & mv[None, :]
    S = tl.load(states_ptr + s_off, mask=s_mask, other=0.0)  # states[0]: the initial state
    _, e0 = _chunk_span(cu_ptr, 0, T, BT, VAR)
    g_last = tl.load(gam_ptr + (e0 - 1) * HV + hv)
    for n in range(NT):
        # the next chunk's total decay, loaded a chunk ahead (a dependent scalar load would stall every chunk)
        _, e_next = _chunk_span(cu_ptr, tl.minimum(n + 1, NT - 1), T, BT, VAR)
        g_next = tl.load(gam_ptr + (e_next - 1) * HV + hv)
        t0, t1 = _chunk_span(cu_ptr, n, T, BT, VAR)
        t = t0 + o_t
        mt = t < t1
        kmask = mt[:, None] & mk[None, :]
        w = tl.load(w_ptr + (t[:, None] * HV + hv) * DK + kk[None, :], mask=kmask, other=0.0)  # [BT, BK]
        k = tl.load(qkv_ptr + t[:, None] * stride_qkv + k_col + kk[None, :], mask=kmask, other=0.0)
        row = (t[:, None] * HV + hv) * DV + vv[None, :]
        umask = mt[:, None] & mv[None, :]
        v_new = tl.load(u_ptr + row, mask=umask, other=0.0) - tl.dot(w, S)  # [BT, BV]
        tl.store(vn_ptr + row, v_new, mask=umask)
        kd = tl.load(kd_ptr + t * HV + hv, mask=mt, other=0.0)
        S = tl.dot(tl.trans(k.to(tl.float32)), v_new * kd[:, None], S * tl.exp(g_last))
        tl.store(states_ptr + (n + 1) * STATE + s_off, S, mask=s_mask)
        g_last = g_next
    if FINAL:
        tl.store(final_ptr + s_off, S, mask=s_mask)


# (BV, stages), timed at first use on a GPU per head shape and per length mode (a device length is another key:
# a prefill graph's warm-up runs tune it before capture). The pass is a
# chain of NT dependent steps per program, so narrower dv blocks buy programs (HV x DV/BV) and, at 2 stages
# (~100 KB of shared memory), two of them per SM; wider ones read W and K fewer times.
_STATE_TUNED = [(16, 2), (32, 2), (16, 3), (32, 3)]
_chunk_state_tuned = triton.autotune([triton.Config({"BV": bv}, num_warps=4, num_stages=st)
                                      for bv, st in _STATE_TUNED], key=["HV", "DK", "DV", "BT"])(_chunk_state_kernel)


@triton.jit
def _chunk_output_kernel(qkv_ptr, gam_ptr, u_ptr, states_ptr, o_ptr, cu_ptr, len_ptr, T, stride_qkv, scale,
                         HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                         KB: tl.constexpr, NKB: tl.constexpr, BV: tl.constexpr, VAR: tl.constexpr,
                         LEN: tl.constexpr):
    if LEN:
        T = tl.minimum(T, tl.load(len_ptr))
    n = tl.program_id(0)
    hv = tl.program_id(1)
    q_col = (hv // (HV // HK)) * DK
    o_t = tl.arange(0, BT)
    t0, t1 = _chunk_span(cu_ptr, n, T, BT, VAR)
    t = t0 + o_t
    mt = t < t1
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    mv = vv < DV
    # raw Q K^T and Q S_in (S_in = states[n], the state entering chunk n) with the row norms, over dk blocks
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    qs = tl.zeros([BT, BV], dtype=tl.float32)
    qn2 = tl.zeros([BT], dtype=tl.float32)
    kn2 = tl.zeros([BT], dtype=tl.float32)
    for kb in tl.static_range(NKB):
        q = _load_rows(qkv_ptr, t, mt, q_col, stride_qkv, KB, kb, DK)
        k = _load_rows(qkv_ptr, t, mt, HK * DK + q_col, stride_qkv, KB, kb, DK)
        kk = kb * KB + tl.arange(0, KB)
        S = tl.load(states_ptr + n * HV * DK * DV + hv * DK * DV + kk[:, None] * DV + vv[None, :],
                    mask=(kk < DK)[:, None] & mv[None, :], other=0.0)  # [KB, BV]
        qk += tl.dot(q, tl.trans(k))
        qs += tl.dot(q, S)
        qn2 += tl.sum(q * q, axis=1)
        kn2 += tl.sum(k * k, axis=1)
    rq = scale / tl.sqrt(qn2 + 1e-6)
    rk = 1.0 / tl.sqrt(kn2 + 1e-6)
    gamma = tl.load(gam_ptr + t * HV + hv, mask=mt, other=0.0)
    causal = o_t[:, None] >= o_t[None, :]
    att = tl.where(causal, rq[:, None] * qk * rk[None, :] * tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :],
                                                                              0.0)), 0.0)  # [BT, BT]
    v_new = tl.load(u_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], mask=mt[:, None] & mv[None, :], other=0.0)
    o = (tl.exp(gamma) * rq)[:, None] * qs + tl.dot(att, v_new)
    tl.store(o_ptr + (t[:, None] * HV + hv) * DV + vv[None, :], o, mask=mt[:, None] & mv[None, :])


@triton.jit
def _gated_norm_kernel(o_ptr, z_ptr, nw_ptr, y_ptr, len_ptr, stride_z, stride_y, eps,
                       HV: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr, LEN: tl.constexpr):
    # one token, all its value heads: y = w * o / rms(o) * silu(z) per head (LEN: a padding row stores nothing)
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BH)
    vv = tl.arange(0, BV)
    heads = HV
    if LEN:  # a padding row masks every head (the limit keeps the mask a tensor for the interpreter)
        heads = tl.where(t < tl.load(len_ptr), HV, 0)
    mask = (h < heads)[:, None] & (vv < DV)[None, :]
    col = h[:, None] * DV + vv[None, :]
    o = tl.load(o_ptr + t * HV * DV + col, mask=mask, other=0.0)  # [BH, BV]
    z = tl.load(z_ptr + t * stride_z + col, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(nw_ptr + vv, mask=vv < DV, other=0.0).to(tl.float32)
    y = o / tl.sqrt(tl.sum(o * o, axis=1) / DV + eps)[:, None] * w[None, :] * (z * tl.sigmoid(z))
    tl.store(y_ptr + t * stride_y + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def gdn_chunk(qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor, norm_weight: torch.Tensor, initial_state: torch.Tensor | None,
              num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
              chunk_size: int = 64, cuts: Sequence[int] = (), length: torch.Tensor | None = None,
              final_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule + gated RMSNorm for one sequence (same contract as ``gdn_chunk_naive``, whose
    ``length`` and ``final_state`` these are: the padding rows and the chunks wholly past the device length are
    masked as a short call's tail, so the real rows' y and states equal an unpadded call's; the final state is written
    into ``final_state`` by the state pass itself).

    qkv [T, conv_dim] post-conv, z [T, HV*dv], a/b [T, HV], initial_state [HV, dk, dv] fp32 or None.
    Returns (y [T, HV*dv] in qkv's dtype, states [len(chunk_ends(T, C, cuts)), HV, dk, dv] fp32, S after each
    chunk; states[-1] is the final state). Chunks are aligned to this call's first token and restart at each cut.
    """
    T = qkv.shape[0]
    HV = a.shape[1]
    HK, DK, DV = num_k_heads, head_k_dim, head_v_dim
    assert qkv.stride(1) == 1 and z.stride(1) == 1 and HV % HK == 0 and qkv.shape[1] == 2 * HK * DK + HV * DV
    assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0 and DK <= 128
    BT = chunk_size
    var, dev_len = bool(cuts), length is not None
    assert not (var and dev_len), "cuts take a host length"
    if var:  # the chunk starts, then T: [NT + 1] int32 (one small queued copy through pinned memory, only with cuts)
        ends = chunk_ends(T, BT, cuts)
        cu = to_device([0, *ends], qkv.device)
        NT = len(ends)
    else:
        NT = triton.cdiv(T, BT)
    BK, BV_full = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    KB, VB = min(BK, 64), min(BV_full, 64)
    f32 = dict(device=qkv.device, dtype=torch.float32)
    gam = torch.empty(T, HV, **f32)  # in-chunk cumulative log decay
    kd = torch.empty(T, HV, **f32)  # key row scale for the state pass: l2norm x decay to the chunk end
    w, u = torch.empty(T, HV, DK, **f32), torch.empty(T, HV, DV, **f32)
    # states[0] holds the initial state so every kernel finds the state entering chunk n at states[n]
    states = torch.empty(NT + 1, HV, DK, DV, **f32)
    if initial_state is None:
        states[0].zero_()
    else:
        states[0].copy_(initial_state)
    o = torch.empty(T, HV, DV, **f32)
    if not var:
        cu = gam  # never read without VAR
    n_ptr = gam if length is None else length  # never read without LEN
    dims = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=BT, KB=KB, NKB=BK // KB)
    _chunk_prep_kernel[(NT, HV)](qkv, a, b, A_log, dt_bias, gam, kd, w, u, cu, n_ptr, T, qkv.stride(0), a.stride(0),
                                 b.stride(0), **dims, VB=VB, NVB=BV_full // VB, SUB=BT // 4, VAR=var, LEN=dev_len,
                                 num_warps=4)
    assert final_state is None or (final_state.is_contiguous() and final_state.shape == (HV, DK, DV))
    state_args = (qkv, gam, kd, w, u, states, o, cu, n_ptr, states if final_state is None else final_state, T, NT,
                  qkv.stride(0))
    state_dims = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=BT, BK=BK, VAR=var, LEN=dev_len, FINAL=final_state is not None)
    if qkv.is_cuda:
        _chunk_state_tuned[lambda meta: (HV, triton.cdiv(DV, meta["BV"]))](*state_args, **state_dims)
    else:
        BV = min(BV_full, 32)
        _chunk_state_kernel[(HV, triton.cdiv(DV, BV))](*state_args, **state_dims, BV=BV)
    # V_new sits in o; each output program reads its V_new block before writing its o block over it
    _chunk_output_kernel[(NT, HV, triton.cdiv(DV, VB))](qkv, gam, o, states, o, cu, n_ptr, T, qkv.stride(0),
                                                        DK ** -0.5, **dims, BV=VB, VAR=var, LEN=dev_len, num_warps=4)
    y = qkv.new_empty(T, HV * DV)
    _gated_norm_kernel[(T,)](o, z, norm_weight, y, n_ptr, z.stride(0), y.stride(0), eps, HV=HV, DV=DV,
                             BH=triton.next_power_of_2(HV), BV=BV_full, LEN=dev_len, num_warps=4)
    return y, states[1:]
