"""GDN prefill's causal depthwise conv + SiLU for one sequence, continuing from the incoming conv window: one kernel
over [BT rows, BC channels] tiles whose first row block also writes the new window over the old one (in place), and
its launcher. The chunked delta rule that reads its output is ``triton.py``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_prefill_kernel(m_ptr, win_ptr, w_ptr, out_ptr, len_ptr, T, C, stride_m, stride_o,
                         K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BJ: tl.constexpr, LEN: tl.constexpr):
    # tile [BT, BC]: tap i of row t reads input t-K+1+i. The K-1 halo rows above the tile come from m (other
    # programs' rows, L2 hits); only the first row block reaches into the incoming window, and that block alone
    # also writes the new window, so an in-place window is read before it is overwritten by the same program.
    # LEN: the real rows are a device value (a padded piece); rows past it are neither read nor written
    if LEN:
        T = tl.minimum(T, tl.load(len_ptr))
    pid_t = tl.program_id(0)
    t = pid_t * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    mt = t < T
    mc = c < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for i in tl.static_range(K):
        src = t - (K - 1) + i
        x = tl.load(m_ptr + src.to(tl.int64)[:, None] * stride_m + c[None, :],
                    mask=((src >= 0) & mt)[:, None] & mc[None, :], other=0.0)
        acc += x.to(tl.float32) * tl.load(w_ptr + c * K + i, mask=mc, other=0.0).to(tl.float32)[None, :]
    if pid_t == 0:
        # rows t < K-1 also read the window: tap i of row t = j - i reads window column j. Per-channel vectors
        # keep the accumulator in the m tiles' register layout (a [BT, BC] window tile would not)
        for j in tl.static_range(K - 1):
            x_j = tl.load(win_ptr + c * (K - 1) + j, mask=mc, other=0.0).to(tl.float32)  # [BC]
            for i in tl.static_range(j + 1):
                wx = tl.load(w_ptr + c * K + i, mask=mc, other=0.0).to(tl.float32) * x_j
                acc += tl.where((t == j - i)[:, None], wx[None, :], 0.0)
        new_win = _next_window(m_ptr, win_ptr, c, mc, T, stride_m, K, BJ)
        # every read of the old window above happens before any thread of this program overwrites it
        tl.debug_barrier()
        jj = tl.arange(0, BJ)
        tl.store(win_ptr + c[:, None] * (K - 1) + jj[None, :], new_win.to(win_ptr.dtype.element_ty),
                 mask=mc[:, None] & (jj < K - 1)[None, :])
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_o + c[None, :],
             (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=mt[:, None] & mc[None, :])


@triton.jit
def _next_window(m_ptr, win_ptr, c, mc, T, stride_m, K: tl.constexpr, BJ: tl.constexpr):
    # the new window is positions T..T+K-2 of cat(window, m): the last K-1 inputs seen. [BC, BJ] fp32
    j = tl.arange(0, BJ)
    idx = T + j
    mask = mc[:, None] & (j < K - 1)[None, :]
    from_m = tl.load(m_ptr + (idx - (K - 1)).to(tl.int64)[None, :] * stride_m + c[:, None],
                     mask=mask & (idx >= K - 1)[None, :], other=0.0)
    from_w = tl.load(win_ptr + c[:, None] * (K - 1) + idx[None, :], mask=mask & (idx < K - 1)[None, :], other=0.0)
    return tl.where((idx >= K - 1)[None, :], from_m.to(tl.float32), from_w.to(tl.float32))


def gdn_conv_prefill(m: torch.Tensor, window: torch.Tensor, conv_weight: torch.Tensor,
                     out: torch.Tensor | None = None, window_out: torch.Tensor | None = None,
                     length: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(causal depthwise conv) over m [T, C] continuing from window [C, K-1]; conv_weight [C, 1, K] or [C, K].
    Returns (out [T, C], the window after the last token [C, K-1]); ``window_out`` may alias ``window``. With
    ``length`` ([1] int32 on m's device) only the first length rows are real: the window is the one after them and
    the padding rows of out are left unwritten (no host read: a padded piece's graph body)."""
    T, C = m.shape
    K = conv_weight.shape[-1]
    assert m.stride(1) == 1 and window.is_contiguous() and window.shape == (C, K - 1)
    assert window_out is None or (window_out.is_contiguous() and window_out.shape == window.shape)
    w = conv_weight.reshape(C, K).contiguous()
    out = torch.empty_like(m) if out is None else out
    if window_out is None:
        window_out = window.clone()
    elif window_out.data_ptr() != window.data_ptr():
        window_out.copy_(window)
    # the kernel updates window_out in place: the first row block reads it and then writes the new window
    # [32, 128] tiles, 4 warps: 16-byte loads, 136 registers on sm_90 (64 rows need 8 warps to avoid spills)
    BT, BC = 32, 128
    _conv_prefill_kernel[(triton.cdiv(T, BT), triton.cdiv(C, BC))](
        m, window_out, w, out, m if length is None else length, T, C, m.stride(0), out.stride(0), K=K, BT=BT, BC=BC,
        BJ=triton.next_power_of_2(K - 1), LEN=length is not None, num_warps=4)
    return out, window_out
