"""The DFlash / DFlash2 block-diffusion drafter in plain torch (z-lab's ``dflash/model.py``; DFlash2's modules in
`dflash_conv` and `dflash_selector`).

    context:  c_p = hidden_norm(fc(concat(target layer outputs at p, for target_layer_ids)))      one per token
              per drafter layer: K_p = RoPE(k_norm(k_proj(c_p)), p), V_p = v_proj(c_p)             kept (context KV)
    block:    x = Embed[anchor, MASK x (B-1)] at positions F .. F+B-1 (the target's embedding)
              per layer: q/k/v of the block, attention of the block over [context K/V ; block K/V], non-causal;
              SwiGLU MLP; DFlash2 wraps both sublayers in the grouped dynamic causal convolution
              drafts' logits = lm_head(norm(x))[1:]  (the target's lm_head)

Norms are plain RMSNorm (``w * x / rms(x)``, Qwen3's), RoPE is NeoX over the whole head at absolute positions.
The block's own K/V are never stored: `block` reads the context and returns logits, nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.drafter import PREFIX, DrafterConfig, DrafterKind, drafter_parameters

from .attention import apply_rope
from .dflash_conv import finish, prepare
from .norms import _compute_dtype
from .rope import rope_cos_sin
from .scope import Scope
from .state import KVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: ``w * x / rms(x)`` over the last dim, normalised in at least fp32."""
    ct = _compute_dtype(x.dtype)
    xf = x.to(ct)
    return (weight.to(ct) * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


@dataclass
class DrafterContext:
    """The drafter's context KV at frontier t: per drafter layer K/V of the positions [start, t) (start > 0 only
    under a draft window), from the target features of those committed tokens."""

    kv: list[KVCache]
    start: int = 0

    @property
    def end(self) -> int:
        return self.start + self.kv[0].length

    def clone(self) -> "DrafterContext":
        return DrafterContext([c.clone() for c in self.kv], self.start)


class Drafter:
    """A drafter's weights (``dflash.*``) over a target's embedding and lm_head, in the target model's dtype."""

    def __init__(self, cfg: DrafterConfig, weights: Mapping[str, torch.Tensor], embed: torch.Tensor,
                 lm_head: torch.Tensor, dtype: torch.dtype = torch.float32):
        specs = drafter_parameters(cfg)
        prepared = {}
        for name, spec in specs.items():
            t = weights.get(name)
            if t is None:
                raise KeyError(f"drafter: missing weight {name!r}")
            if tuple(t.shape) != spec.shape:
                raise ValueError(f"drafter: weight {name!r} has shape {tuple(t.shape)}, expected {spec.shape}")
            prepared[name] = t.to(dtype)
        self.cfg, self.dtype, self.embed, self.lm_head = cfg, dtype, embed, lm_head
        self.root = Scope(prepared, PREFIX.rstrip("."))
        d = cfg.head_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(
            torch.float64 if dtype == torch.float64 else torch.float32) / d))  # [d/2]

    def empty_context(self) -> DrafterContext:
        c = self.cfg
        shape = (c.num_key_value_heads, 0, c.head_dim)
        return DrafterContext([KVCache(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                               for _ in range(c.num_hidden_layers)])

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, 1.0, self.dtype)  # [T, d] each

    def _kv(self, w: Scope, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Keys (k_norm, RoPE) and values of x [T, H] for one layer: [nkv, T, d] each."""
        c = self.cfg
        T = x.shape[0]
        k = rms_norm(_proj(x, w, "k_proj", c).view(T, c.num_key_value_heads, c.head_dim), w["k_norm.weight"],
                     c.rms_norm_eps).transpose(0, 1)
        v = _proj(x, w, "v_proj", c).view(T, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        return apply_rope(k, cos, sin), v

    def extend(self, ctx: DrafterContext, taps: torch.Tensor, start: int, window: int | None,
               positions: torch.Tensor | None = None) -> None:
        """Append the context of positions start.. from the target taps [T, n * H] (the tapped layers' outputs
        concatenated), then keep only the last `window` positions (None: all). `positions` [T]: their rotary
        positions where those are not the indices (a sequence with images, `PromptMedia.drafter_positions`)."""
        assert ctx.end == start, f"drafter context ends at {ctx.end}, the consumed tokens start at {start}"
        c = self.cfg
        feats = rms_norm(F.linear(taps.to(self.dtype), self.root["fc.weight"]), self.root["hidden_norm.weight"],
                         c.rms_norm_eps)  # [T, H]
        cos, sin = self._rope(torch.arange(start, start + feats.shape[0]) if positions is None else positions)
        for i, cache in enumerate(ctx.kv):
            cache.append(*self._kv(self.root.sub(f"layers.{i}.self_attn"), feats, cos, sin))
        if window is not None and ctx.kv[0].length > window:
            drop = ctx.kv[0].length - window
            ctx.kv = [KVCache(k.k[:, drop:].clone(), k.v[:, drop:].clone()) for k in ctx.kv]
            ctx.start += drop

    def block(self, ctx: DrafterContext, anchor: int, block_size: int, rope_delta: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """One non-causal pass over [anchor, MASK x (B-1)] at positions ctx.end ..: the drafts' logits [B-1, V] and
        final-normed hidden [B-1, H] (slots 1..B-1). `ctx` is read, never extended. The block rotates at its
        positions + `rope_delta` (after a prompt with images)."""
        c = self.cfg
        F0 = ctx.end + rope_delta
        ids = torch.tensor([anchor] + [c.mask_token_id] * (block_size - 1))
        x = self.embed[ids].to(self.dtype)  # [B, H]
        cos, sin = self._rope(torch.arange(F0, F0 + block_size))
        for i, cache in enumerate(ctx.kv):
            x = self._layer(x, self.root.sub(f"layers.{i}"), cache, cos, sin)
        h = rms_norm(x, self.root["norm.weight"], c.rms_norm_eps)[1:]  # [B-1, H]
        return F.linear(h, self.lm_head.to(self.dtype)), h

    def _layer(self, x: torch.Tensor, w: Scope, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, eps = self.cfg, self.cfg.rms_norm_eps
        conv = c.kind is DrafterKind.DFLASH2
        h = rms_norm(x, w["input_layernorm.weight"], eps)
        if conv:
            h, later = prepare(h, w.sub("attention_conv"), c)
        a = self._attention(h, w.sub("self_attn"), cache, cos, sin)
        x = x + (finish(a, later, w.sub("attention_conv"), c) if conv else a)
        h = rms_norm(x, w["post_attention_layernorm.weight"], eps)
        if conv:
            h, later = prepare(h, w.sub("mlp_conv"), c)
        m = F.linear(F.silu(F.linear(h, w["mlp.gate_proj.weight"])) * F.linear(h, w["mlp.up_proj.weight"]),
                     w["mlp.down_proj.weight"])
        return x + (finish(m, later, w.sub("mlp_conv"), c) if conv else m)

    def _attention(self, x: torch.Tensor, w: Scope, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor
                   ) -> torch.Tensor:
        """The block's queries over the context and the block itself, no mask; x [B, H] -> [B, H]."""
        c = self.cfg
        B, nh, d = x.shape[0], c.num_attention_heads, c.head_dim
        q = rms_norm(_proj(x, w, "q_proj", c).view(B, nh, d), w["q_norm.weight"], c.rms_norm_eps).transpose(0, 1)
        q = apply_rope(q, cos, sin)  # [nh, B, d]
        k_blk, v_blk = self._kv(w, x, cos, sin)
        group = nh // c.num_key_value_heads
        k = torch.cat([cache.k, k_blk], dim=1).repeat_interleave(group, dim=0)  # [nh, S + B, d]
        v = torch.cat([cache.v, v_blk], dim=1).repeat_interleave(group, dim=0)
        sd = torch.float64 if q.dtype == torch.float64 else torch.float32
        probs = torch.softmax(((q @ k.transpose(1, 2)) * d ** -0.5).to(sd), dim=-1).to(q.dtype)  # [nh, B, S + B]
        return _proj((probs @ v).transpose(0, 1).reshape(B, nh * d), w, "o_proj", c)


def _proj(x: torch.Tensor, w: Scope, name: str, cfg: DrafterConfig) -> torch.Tensor:
    return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"] if cfg.attention_bias else None)
