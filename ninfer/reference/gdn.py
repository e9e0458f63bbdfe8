"""Gated DeltaNet mixer: causal depthwise conv with an explicit window, gates, and the gated delta rule.

The delta rule comes in two forms that must agree: the per-token step recurrence (decode) and the chunked
(WY / UT-transform) form over 64-token chunks (prefill), which also yields S at every chunk boundary.
Per value head j with key head ``j // (HV / HK)``, decay ``alpha = exp(g)`` and write strength ``beta``:
    S' = alpha S;   S = S' + k (beta (v - S'^T k))^T;   o = S^T q        (S [dk, dv], read after the write)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import Qwen35Config

from .activations import activation
from .norms import gated_rms_norm
from .scope import Scope
from .state import GDNState

CHUNK = 64


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    # The recurrence and its gates run in fp32 (HF, FLA, vLLM all do), or fp64 in the fp64 oracle mode.
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_conv(m: torch.Tensor, window: torch.Tensor, weight: torch.Tensor,
                act: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + activation (the config's hidden_act, SiLU in every released model) over time,
    continuing from ``window``.

    m [T, C] pre-conv inputs; window [C, K-1] the previous K-1 inputs (zeros at sequence start); weight [C, 1, K]
    with ``weight[:, 0, K-1]`` on the current token. Returns (out [T, C], full [C, K-1+T]); the window before
    token t of this call is ``full[:, t : t+K-1]``.
    """
    K = weight.shape[-1]
    full = torch.cat([window.to(m.dtype), m.transpose(0, 1)], dim=1)  # [C, K-1+T]
    taps = full.unfold(1, K, 1)  # [C, T, K]: taps[c, t, i] = input at t-K+1+i
    out = (taps * weight[:, 0, None, :].to(m.dtype)).sum(-1)  # [C, T]
    return act(out).transpose(0, 1), full


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (log decay, < 0); a, b [T, HV] -> [T, HV] each."""
    sd = _state_dtype(a.dtype)
    beta = torch.sigmoid(b).to(sd)
    g = -A_log.to(sd).exp() * F.softplus(a.to(sd) + dt_bias.to(sd))
    return g, beta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    q, k [T, HV, dk] (normalised, q scaled), v [T, HV, dv], g, beta [T, HV], S [HV, dk, dv] initial state.
    Returns (o [T, HV, dv], final S).
    """
    outs = []
    for t in range(q.shape[0]):
        S = S * g[t].exp()[:, None, None]
        read = torch.einsum("hkv,hk->hv", S, k[t])  # [HV, dv] memory read for key k_t
        u = beta[t][:, None] * (v[t] - read)  # [HV, dv]
        S = S + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
    return torch.stack(outs), S


def _chunk_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the parallel form; q, k [HV, C, dk], v [HV, C, dv], g, beta [HV, C], S [HV, dk, dv]."""
    C = q.shape[1]
    gamma = g.cumsum(-1)  # [HV, C] cumulative log decay inside the chunk
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    # D[r, s] = exp(gamma_r - gamma_s) for s <= r; masking before exp avoids overflow above the diagonal.
    D = (gamma[:, :, None] - gamma[:, None, :]).masked_fill(~causal, float("-inf")).exp()  # [HV, C, C]
    A = (beta[:, :, None] * (k @ k.transpose(1, 2)) * D).tril(-1)
    eye = torch.eye(C, dtype=q.dtype).expand_as(A)
    # (I + A) is unit lower triangular: U and W come from one triangular solve each (the WY/UT transform).
    U = torch.linalg.solve_triangular(eye + A, beta[:, :, None] * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(eye + A, (beta * gamma.exp())[:, :, None] * k, upper=False, unitriangular=True)
    v_new = U - W @ S  # [HV, C, dv]
    o = gamma.exp()[:, :, None] * (q @ S) + ((q @ k.transpose(1, 2)) * D) @ v_new
    tail = (gamma[:, -1:] - gamma).exp()  # [HV, C] decay from each position to the chunk end
    S = gamma[:, -1].exp()[:, None, None] * S + (tail[:, :, None] * k).transpose(1, 2) @ v_new
    return o, S


def chunk_ends(T: int, cuts: Sequence[int] = (), chunk: int = CHUNK) -> list[int]:
    """End offsets of the chunks of a T-token call: every `chunk` tokens from its start, restarting at each cut
    (ascending, strictly inside (0, T)); the last is T."""
    ends = []
    for a, b in zip([0, *cuts], [*cuts, T]):
        ends.extend(range(min(a + chunk, b), b, chunk))
        ends.append(b)
    return ends


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       S: torch.Tensor, chunk: int = CHUNK, cuts: Sequence[int] = ()
                       ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Chunked gated delta rule, chunks aligned to the start of this call and restarting at each cut (the last
    one of each stretch may be short), so the state at a cut is exactly the one a call ending there reaches.

    Same shapes as :func:`recurrent_delta_rule`. Returns (o, final S, [S after each chunk that ends before T]).
    """
    T = q.shape[0]
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [HV, T, *]
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)  # [HV, T]
    outs, boundaries, s = [], [], 0
    for e in chunk_ends(T, cuts, chunk):
        o, S = _chunk_step(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], S)
        outs.append(o)
        if e < T:
            boundaries.append(S.clone())
        s = e
    return torch.cat(outs, dim=1).transpose(0, 1), S, boundaries


def _split_heads(mc: torch.Tensor, cfg: Qwen35Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-conv channels [T, conv_dim] -> q, k [T, HV, dk] (l2-normalised, q scaled, shared by value heads) and
    v [T, HV, dv], all in the state dtype."""
    T = mc.shape[0]
    HK, HV, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    sd = _state_dtype(mc.dtype)
    q, k, v = torch.split(mc.to(sd), [HK * dk, HK * dk, HV * dv], dim=-1)
    # Value head j reads key head j // (HV / HK): consecutive value heads share a key head.
    q = l2norm(q.reshape(T, HK, dk)).repeat_interleave(HV // HK, dim=1) * dk ** -0.5
    k = l2norm(k.reshape(T, HK, dk)).repeat_interleave(HV // HK, dim=1)
    return q, k, v.reshape(T, HV, dv)


def gdn_mixer(x: torch.Tensor, w: Scope, cfg: Qwen35Config, state: GDNState, chunked: bool,
              boundaries: list[GDNState] | None = None, cuts: Sequence[int] = ()) -> torch.Tensor:
    """One GDN mixer (``w`` scoped at ``<layer>.linear_attn``); x [T, H] -> [T, H]; ``state`` advanced in place.

    With ``chunked`` the 64-token parallel form runs (chunks aligned to this call's start, restarting at each of
    ``cuts``) and, when ``boundaries`` is a list, the (conv window, S) at every interior chunk boundary
    (`chunk_ends`) is appended to it.
    """
    T = x.shape[0]
    HV, dv, K = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    mc, full = causal_conv(F.linear(x, w["in_proj_qkv.weight"]), state.conv, w["conv1d.weight"], activation(cfg))
    q, k, v = _split_heads(mc, cfg)
    g, beta = gates(F.linear(x, w["in_proj_a.weight"]), F.linear(x, w["in_proj_b.weight"]), w["A_log"], w["dt_bias"])
    S0 = state.recurrent.to(q.dtype)
    if chunked:
        o, S, inner = chunked_delta_rule(q, k, v, g, beta, S0, cuts=cuts)
        if boundaries is not None:
            ends = chunk_ends(T, cuts)[:-1]
            boundaries.extend(GDNState(full[:, e:e + K - 1].clone(), s) for e, s in zip(ends, inner))
    else:
        o, S = recurrent_delta_rule(q, k, v, g, beta, S0)
    state.conv = full[:, full.shape[1] - (K - 1):].clone()
    state.recurrent = S.to(state.recurrent.dtype)
    z = F.linear(x, w["in_proj_z.weight"]).view(T, HV, dv)
    y = gated_rms_norm(o.to(x.dtype), z, w["norm.weight"], cfg.rms_norm_eps)  # [T, HV, dv]
    return F.linear(y.reshape(T, HV * dv), w["out_proj.weight"])
