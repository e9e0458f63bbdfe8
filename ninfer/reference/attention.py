"""Gated full attention: q/gate from one projection, zero-centred q/k norm, partial NeoX RoPE, GQA, sigmoid gate.

Text-only MRoPE has the same position in all three rows, so it is exactly 1D RoPE on the first ``rotary_dim``
dims of each head, whatever ``mrope_section`` says; the remaining dims pass through unrotated. A prompt with images
passes its 3-row positions (``ninfer.contracts.media``), interleaved over the frequencies by ``mrope_section``. The frequencies
follow the config's RoPE type (`ninfer.reference.rope`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import Qwen35Config

from .norms import zc_rms_norm
from .rope import mrope_cos_sin, rope_cos_sin, rope_frequencies
from .scope import Scope
from .state import KVCache


def _angle_dtype(dtype: torch.dtype) -> torch.dtype:
    # HF builds angles in fp32 and casts cos/sin to the activation dtype; the fp64 mode keeps fp64 throughout.
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX convention: ``[a, b] -> [-b, a]`` over the last dim's halves."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of every head; x [heads, T, d], cos/sin [T, rotary_dim]."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Softmax attention of new queries over all cached keys.

    q [nh, T, d] at absolute positions start..start+T-1; k, v [nkv, S, d] at positions 0..S-1 (S = start + T).
    Query head h reads KV head ``h // (nh / nkv)``. Returns [nh, T, d].
    """
    nh, T, d = q.shape
    group = nh // k.shape[0]
    k = k.repeat_interleave(group, dim=0)  # [nh, S, d]
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(1, 2)) * d ** -0.5  # [nh, T, S]
    q_pos = torch.arange(start, start + T)[:, None]
    k_pos = torch.arange(k.shape[1])[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    sd = torch.float64 if q.dtype == torch.float64 else torch.float32
    probs = torch.softmax(scores.to(sd), dim=-1).to(q.dtype)
    return probs @ v


def gated_attention(x: torch.Tensor, w: Scope, cfg: Qwen35Config, cache: KVCache,
                    positions: torch.Tensor | None = None) -> torch.Tensor:
    """One attention mixer (``w`` scoped at ``<layer>.self_attn``); x [T, H] -> [T, H].

    The new tokens sit at sequence indices ``cache.length ..``; their keys/values are appended to ``cache``. Their
    rotary positions are those indices, or the 3-row MRoPE ``positions`` [3, T] when given.
    """
    T = x.shape[0]
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    # q_proj rows are per head [query(d), gate(d)], so a [T, nh, 2d] view splits them per head.
    q, gate = _proj(x, w, "q_proj", cfg).view(T, nh, 2 * d).chunk(2, dim=-1)  # [T, nh, d] each
    q = zc_rms_norm(q, w["q_norm.weight"], eps).transpose(0, 1)  # [nh, T, d]
    k = zc_rms_norm(_proj(x, w, "k_proj", cfg).view(T, nkv, d), w["k_norm.weight"], eps).transpose(0, 1)
    v = _proj(x, w, "v_proj", cfg).view(T, nkv, d).transpose(0, 1)  # [nkv, T, d]
    start = cache.length
    freqs = rope_frequencies(cfg, _angle_dtype(x.dtype))
    if positions is None:
        cos, sin = rope_cos_sin(torch.arange(start, start + T), *freqs, x.dtype)
    else:
        cos, sin = mrope_cos_sin(positions, *freqs, cfg.mrope_section, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    cache.append(k, v)
    o = causal_attention(q, cache.k, cache.v, start)  # [nh, T, d]
    o = o.transpose(0, 1).reshape(T, nh * d) * torch.sigmoid(gate.reshape(T, nh * d))
    return _proj(o, w, "o_proj", cfg)


def _proj(x: torch.Tensor, w: Scope, name: str, cfg: Qwen35Config) -> torch.Tensor:
    return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"] if cfg.attention_bias else None)
