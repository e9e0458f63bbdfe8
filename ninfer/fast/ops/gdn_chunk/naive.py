"""GDN prefill for one sequence in plain fp32 torch: the causal conv continuing from a window, and the gated delta
rule run token by token (the step-7 recurrence of qwen35-architecture.md, which the chunked kernel must reproduce),
recording S at every chunk end, followed by the gated RMSNorm.

Chunks are aligned to the call's first token and restart at every ``cuts`` offset (`chunk_ends`), so the state at a
cut is one of the returned chunk states: a checkpoint inside a prefill piece without cutting the piece.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def gdn_conv_prefill_naive(m: torch.Tensor, window: torch.Tensor, conv_weight: torch.Tensor,
                           length: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """m [T, C] pre-conv inputs, window [C, K-1] the K-1 inputs before them, conv_weight [C, 1, K] or [C, K].
    Returns (silu(conv) [T, C] in m's dtype, the window after the last token [C, K-1] in window's dtype). With
    ``length`` ([1]) only its first rows are real: the window after them, the padding rows of out zero."""
    if length is not None:
        n = int(length[0])
        out, win = gdn_conv_prefill_naive(m[:n], window, conv_weight)
        return torch.cat([out, out.new_zeros(m.shape[0] - n, m.shape[1])]), win
    T, C = m.shape
    K = conv_weight.shape[-1]
    full = torch.cat([window.float(), m.float().t()], dim=1)  # [C, K-1+T]
    taps = full.unfold(1, K, 1)  # [C, T, K]: taps[c, t, i] = input at t-K+1+i
    out = F.silu((taps * conv_weight.reshape(C, 1, K).float()).sum(-1)).t()
    return out.to(m.dtype), full[:, T:].to(window.dtype)


def chunk_ends(T: int, chunk_size: int, cuts: Sequence[int] = ()) -> list[int]:
    """The end offsets of a call's chunks: every ``chunk_size`` tokens from the start, restarting at each cut
    (ascending, 0 < cut < T); the last is T. The state after chunk i is states[i] of `gdn_chunk`."""
    if list(cuts) != sorted(set(cuts)) or any(not 0 < c < T for c in cuts):
        raise ValueError(f"cuts {list(cuts)} must ascend strictly inside (0, {T})")
    ends = []
    for a, b in zip([0, *cuts], [*cuts, T]):
        ends.extend(range(min(a + chunk_size, b), b, chunk_size))
        ends.append(b)
    return ends


def conv_window_at(m: torch.Tensor, window: torch.Tensor, end: int) -> torch.Tensor:
    """The conv window [C, K-1] after the first ``end`` tokens of m [T, C] (for a checkpoint inside a prefill
    piece): the last K-1 pre-conv inputs, from m and, when end < K-1, the incoming window [C, K-1]. A slice of at
    most K-1 rows, not a kernel."""
    tail = m[max(0, end - window.shape[1]):end].t().to(window.dtype)  # [C, min(end, K-1)]
    return torch.cat([window[:, tail.shape[1]:], tail], dim=1)


def gdn_chunk_naive(qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                    dt_bias: torch.Tensor, norm_weight: torch.Tensor, initial_state: torch.Tensor | None,
                    num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
                    chunk_size: int = 64, cuts: Sequence[int] = (), length: torch.Tensor | None = None,
                    final_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, conv_dim] post-conv, z [T, HV*dv], a/b [T, HV], initial_state [HV, dk, dv] (None = zeros).
    Returns (y [T, HV*dv] in qkv's dtype, states [len(chunk_ends(T, chunk_size, cuts)), HV, dk, dv] fp32: S after
    each chunk, the last one being the final state). ``length`` ([1]): only its first rows are real (y zero past
    them, the states of its chunks); ``final_state`` [HV, dk, dv] receives the final state."""
    if length is not None:
        n = int(length[0])
        y, states = gdn_chunk_naive(qkv[:n], z[:n], a[:n], b[:n], A_log, dt_bias, norm_weight, initial_state,
                                    num_k_heads, head_k_dim, head_v_dim, eps, chunk_size, cuts, None, final_state)
        return torch.cat([y, y.new_zeros(qkv.shape[0] - n, y.shape[1])]), states
    T = qkv.shape[0]
    HK, dk, dv = num_k_heads, head_k_dim, head_v_dim
    HV = a.shape[1]
    q, k, v = torch.split(qkv.float(), [HK * dk, HK * dk, HV * dv], dim=-1)
    q = q.reshape(T, HK, dk)
    k = k.reshape(T, HK, dk)
    q = (q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5).repeat_interleave(HV // HK, 1)
    k = (k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(HV // HK, 1)  # [T, HV, dk]
    v = v.reshape(T, HV, dv)
    beta = torch.sigmoid(b.float())
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())  # [T, HV]
    S = qkv.new_zeros(HV, dk, dv, dtype=torch.float32) if initial_state is None else initial_state.float().clone()
    outs, states, ends = [], [], set(chunk_ends(T, chunk_size, cuts))
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        if t + 1 in ends:
            states.append(S.clone())
    o = torch.stack(outs)  # [T, HV, dv]
    on = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    y = on * F.silu(z.float().view(T, HV, dv))
    if final_state is not None:
        final_state.copy_(states[-1])
    return y.reshape(T, HV * dv).to(qkv.dtype), torch.stack(states)
