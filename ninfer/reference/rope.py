"""RoPE frequencies of a Qwen3.5 config, for every RoPE type the config accepts (`rope_config.STATIC_ROPE_TYPES`).

Each type is a fixed table computed once: ``inv_freq`` [pairs] and a factor that scales cos and sin (yarn's
attention factor, else 1). The formulas are those transformers applies (`ROPE_INIT_FUNCTIONS`): plain
``1 / theta^(2i/dim)``; ``linear`` divides by the factor; ``llama3`` divides the low frequencies by the factor and
blends the middle band; ``yarn`` blends interpolated and extrapolated frequencies along a ramp between the
correction dimensions of ``beta_fast``/``beta_slow`` rotations; ``proportional`` rotates
``int(factor * head_dim // 2)`` pairs with exponents over the whole head and leaves the rest at frequency 0.
"""

from __future__ import annotations

import math

import torch

from ninfer.models.qwen3_5.config import Qwen35Config


def _plain(dim: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))  # [ceil(dim/2)]


def _llama3(inv: torch.Tensor, p: dict) -> torch.Tensor:
    old = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / p["low_freq_factor"], old / p["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / p["factor"], inv)
    smooth = (old / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
    blended = (1 - smooth) * scaled / p["factor"] + smooth * scaled
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, theta: float, p: dict, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    factor, original = p["factor"], p["original_max_position_embeddings"]
    scale = p.get("attention_factor")
    if scale is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        scale = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                 else _yarn_mscale(factor))

    def correction_dim(rotations: float) -> float:
        # the dimension whose wavelength fits `rotations` turns into the original context
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)  # 0: extrapolate, 1: interpolate
    extrapolated = _plain(dim, theta, dtype)
    return extrapolated / factor * ramp + extrapolated * (1 - ramp), float(scale)


def rope_frequencies(cfg: Qwen35Config, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(inv_freq [cfg.rotary_dim / 2] in ``dtype``, cos/sin scale) for ``cfg``'s RoPE type."""
    p, dim, theta = dict(cfg.rope_scaling), cfg.rope_dim, cfg.rope_theta
    if cfg.rope_type == "linear":
        return _plain(dim, theta, dtype) / p["factor"], 1.0
    if cfg.rope_type == "llama3":
        return _llama3(_plain(dim, theta, dtype), p), 1.0
    if cfg.rope_type == "yarn":
        return _yarn(dim, theta, p, dtype)
    if cfg.rope_type == "proportional":
        angles = int(cfg.partial_rotary_factor * cfg.head_dim // 2)
        rotated = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(dtype) / cfg.head_dim))
        inv = torch.cat([rotated, torch.zeros(cfg.head_dim // 2 - angles, dtype=dtype)])
        return inv / p.get("factor", 1.0), 1.0
    return _plain(dim, theta, dtype), 1.0


def mrope_rows(pairs: int, section: tuple[int, ...]) -> torch.Tensor:
    """Which position row (0 T, 1 H, 2 W) each of the ``pairs`` frequencies reads: interleaved, frequency i from H
    when i % 3 == 1 and i < 3 * section[1], from W when i % 3 == 2 and i < 3 * section[2], else from T
    (transformers' ``Qwen3_5TextRotaryEmbedding.recomposition_frequencies``)."""
    rows = torch.zeros(pairs, dtype=torch.long)
    for row in (1, 2):
        rows[row:3 * section[row]:3] = row
    return rows


def mrope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, section: tuple[int, ...],
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 2 * pairs] for 3-row MRoPE ``positions`` [3, T]; equal rows give exactly ``rope_cos_sin``."""
    pairs = inv_freq.shape[0]
    angles = positions.to(inv_freq.dtype)[:, :, None] * inv_freq  # [3, T, pairs]
    rows = mrope_rows(pairs, section)
    picked = angles.gather(0, rows.view(1, 1, pairs).expand(1, positions.shape[1], pairs))[0]  # [T, pairs]
    emb = torch.cat([picked, picked], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 2 * pairs] = cat(f(angles), f(angles)) * scale for absolute ``positions`` [T]; the angles are
    computed in ``inv_freq``'s dtype and cast to ``dtype``, as HF casts cos/sin to the activation dtype."""
    angles = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]  # [T, pairs]
    emb = torch.cat([angles, angles], dim=-1)  # [T, 2 * pairs]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
