"""The DFlash / DFlash2 drafter on the device, eager, from the fast ops (docs/speculative.md, "DFlash on the fast
Program"): the same math as `ninfer.reference.dflash`, over paged context K/V.

    extend:  c = hidden_norm(fc(taps));  per layer: k_norm + RoPE of k_proj(c), v_proj(c) written at the positions'
             page slots (`rope_kv_write`), so the context lives in pages of the drafter's own geometry
    block:   R rows' [anchor, MASK x (B-1)] at positions F_r..F_r+B-1, packed; per layer q/k/v of the block, the block's K/V written at
             its slots (past the frontier: positions the next consumption rewrites before anything reads them), and
             every block query attends to all F + B keys (from the window's first key): `paged_decode_attention` with
             one row per query and context length F + B is exactly the non-causal block attention; DFlash2's convolution (`dflash_conv`)
             around both sublayers; final norm, the target's lm_head on slots 1..B-1

The fast kernels' RMSNorm is zero-centred (``x / rms * (1 + w)``); the drafter's is Qwen3's plain one (``x / rms *
w``), so its norm weights are stored as ``w - 1`` at load. Which pages hold the context (a slot's block table,
shared prefixes, the window) is the caller's: this class only reads and writes the pages it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ninfer.fast.hostcopy import to_device
from ninfer.models.qwen3_5.drafter import PREFIX, DrafterConfig, DrafterKind

from .kernels import Kernels
from .layers import head_logits


@dataclass(frozen=True)
class DrafterLayer:
    input_norm: torch.Tensor  # [H], stored as w - 1 (see the module docstring)
    q: torch.Tensor  # [nh * d, H]
    k: torch.Tensor  # [nkv * d, H]
    v: torch.Tensor
    o: torch.Tensor  # [H, nh * d]
    q_norm: torch.Tensor  # [d], w - 1
    k_norm: torch.Tensor
    post_norm: torch.Tensor  # [H], w - 1
    gate_up: torch.Tensor  # [2I, H], gate rows first
    down: torch.Tensor  # [H, I]
    conv: tuple[torch.Tensor, ...] | None  # DFlash2: attention (base, projection), then MLP (base, projection)


@dataclass(frozen=True)
class DrafterWeights:
    fc: torch.Tensor  # [H, n * H]
    hidden_norm: torch.Tensor  # w - 1
    layers: tuple[DrafterLayer, ...]
    norm: torch.Tensor  # w - 1
    selector: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # hidden_projection, predecessor, successor


def load_drafter_weights(cfg: DrafterConfig, source: Callable[[str], torch.Tensor], dtype: torch.dtype,
                         device: torch.device | str) -> DrafterWeights:
    """The drafter's ``dflash.*`` tensors (``source(name)``) on `device` in `dtype`; norms as w - 1, gate|up fused."""
    def get(name: str) -> torch.Tensor:
        return source(PREFIX + name).to(device=device, dtype=dtype).contiguous()

    def norm(name: str) -> torch.Tensor:
        return (source(PREFIX + name).to(device=device, dtype=torch.float32) - 1.0).to(dtype)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        conv = None
        if cfg.kind is DrafterKind.DFLASH2:
            conv = tuple(get(p + n) for n in ("attention_conv.base_kernel", "attention_conv.kernel_projection.weight",
                                              "mlp_conv.base_kernel", "mlp_conv.kernel_projection.weight"))
        layers.append(DrafterLayer(
            norm(p + "input_layernorm.weight"), get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight"),
            get(p + "self_attn.v_proj.weight"), get(p + "self_attn.o_proj.weight"),
            norm(p + "self_attn.q_norm.weight"), norm(p + "self_attn.k_norm.weight"),
            norm(p + "post_attention_layernorm.weight"),
            torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]), get(p + "mlp.down_proj.weight"),
            conv))
    selector = None
    if cfg.kind is DrafterKind.DFLASH2:
        selector = tuple(get("candidate_selector." + n) for n in
                         ("hidden_projection.weight", "predecessor_codebook", "successor_codebook"))
    return DrafterWeights(get("fc.weight"), norm("hidden_norm.weight"), tuple(layers), norm("norm.weight"), selector)


class FastDrafter:
    def __init__(self, cfg: DrafterConfig, weights: DrafterWeights, kernels: Kernels, embed: torch.Tensor,
                 lm_head: torch.Tensor):
        self.cfg, self.w, self.k, self.embed, self.lm_head = cfg, weights, kernels, embed, lm_head

    def _kv_write(self, lw: DrafterLayer, x: torch.Tensor, q: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> torch.Tensor:
        """k_norm + RoPE of x's keys and its values into their page slots; q [T, nh, d] comes back normed and
        rotated."""
        c, T = self.cfg, x.shape[0]
        k = self.k.linear(x, lw.k).view(T, c.num_key_value_heads, c.head_dim)
        v = self.k.linear(x, lw.v).view(T, c.num_key_value_heads, c.head_dim)
        return self.k.rope_kv_write(q, k, v, positions, slots, k_pages, v_pages, c.head_dim, c.rope_theta,
                                    lw.q_norm, lw.k_norm, c.rms_norm_eps)

    def extend(self, taps: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               k_pages: list[torch.Tensor], v_pages: list[torch.Tensor]) -> None:
        """The context of T consumed positions from the target taps [T, n * H]: every layer's keys and values at
        `slots` [T] (flat page slots, page * page_size + offset) of that layer's pages [P, page_size, nkv, d]."""
        c = self.cfg
        feats = self.k.rmsnorm(self.k.linear(taps.to(self.w.fc.dtype), self.w.fc), self.w.hidden_norm,
                               c.rms_norm_eps, None)[0]  # [T, H]
        no_queries = feats.new_zeros(feats.shape[0], 1, c.head_dim)  # the context has no queries to rotate
        for lw, kp, vp in zip(self.w.layers, k_pages, v_pages):
            self._kv_write(lw, feats, no_queries, positions, slots, kp, vp)

    def block(self, anchors: list[int], frontiers: list[int], tables: torch.Tensor, block_size: int,
              k_pages: list[torch.Tensor], v_pages: list[torch.Tensor], first_keys: list[int] | None = None,
              rope_deltas: list[int] | None = None, draft_vocab: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over [anchor, MASK x (B-1)] at positions frontier.. for each of R rows: the drafts' logits
        [R, B-1, V] fp32 and the final-normed hidden [R, B-1, H]. `tables` [R, max_pages] int32 names each row's
        pages of positions < frontier + B (the context's, then the scratch pages the block's own K/V go to);
        `first_keys` [R] the first context key each row attends to (a draft window; None: 0); `rope_deltas` [R]
        what each row's block rotates at beyond its positions (rope_delta after a prompt with images; None: 0);
        `draft_vocab` the logits over the token ids below it alone (`head_logits`; None: the whole vocabulary)."""
        R = len(anchors)
        # every row's (anchor, frontier, rope delta, first key) in one copy queued without a host wait: [4, R]
        anchor, front, delta, first_key = to_device([list(anchors), list(frontiers), list(rope_deltas or [0] * R),
                                                     list(first_keys or [0] * R)], self.embed.device).unbind(0)
        return self.block_on(anchor, front, delta, None if first_keys is None else first_key, tables, block_size,
                             k_pages, v_pages, draft_vocab)

    def block_on(self, anchor: torch.Tensor, front: torch.Tensor, delta: torch.Tensor, first_key: torch.Tensor | None,
                 tables: torch.Tensor, block_size: int, k_pages: list[torch.Tensor], v_pages: list[torch.Tensor],
                 draft_vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`block` from device data alone (anchor, front, delta, first_key [R] int32; graph-safe: the DFlash draft
        graphs' body, `dflash_graphs.py`)."""
        c, kern, B, R = self.cfg, self.k, block_size, anchor.shape[0]
        dev = self.embed.device
        ids = torch.full((R, B), c.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = anchor
        ids = ids.view(-1)  # [R * B]
        positions = (front[:, None] + torch.arange(B, dtype=torch.int32, device=dev)).view(-1)  # [R * B] int32
        rope = positions + delta.repeat_interleave(B)
        ps = k_pages[0].shape[1]
        rows = torch.arange(R, device=dev).repeat_interleave(B)
        slots = tables[rows, (positions // ps).long()].long() * ps + (positions % ps).long()
        q_tables = tables[rows].contiguous()  # one attention row per block query
        lens = (front + B).repeat_interleave(B)
        first = None if first_key is None else first_key.repeat_interleave(B)
        x = F.embedding(ids, self.embed).to(self.w.fc.dtype)  # [R * B, H]
        for lw, kp, vp in zip(self.w.layers, k_pages, v_pages):
            h = kern.rmsnorm(x, lw.input_norm, c.rms_norm_eps, None)[0]
            attn_later = None
            if lw.conv is not None:
                h, attn_later = self._prepare(h, lw.conv[0], lw.conv[1], B)
            q = kern.linear(h, lw.q).view(R * B, c.num_attention_heads, c.head_dim)
            q = self._kv_write(lw, h, q, rope, slots, kp, vp)
            a = kern.paged_decode_attention(q, kp, vp, q_tables, lens, first_keys=first)
            a = kern.linear(a.reshape(R * B, -1), lw.o)
            x = x + (a if attn_later is None else kern.dflash_conv(a, attn_later, lw.conv[0][1], B))
            h = kern.rmsnorm(x, lw.post_norm, c.rms_norm_eps, None)[0]
            mlp_later = None
            if lw.conv is not None:
                h, mlp_later = self._prepare(h, lw.conv[2], lw.conv[3], B)
            m = kern.linear(kern.linear_swiglu(h, lw.gate_up), lw.down)
            x = x + (m if mlp_later is None else kern.dflash_conv(m, mlp_later, lw.conv[2][1], B))
        hidden = kern.rmsnorm(x, self.w.norm, c.rms_norm_eps, None)[0].view(R, B, -1)[:, 1:]  # [R, B-1, H]
        return head_logits(hidden, self.lm_head.to(hidden.dtype), draft_vocab), hidden

    def _prepare(self, h: torch.Tensor, base: torch.Tensor, proj: torch.Tensor, block: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolved sublayer input and the finish side's coefficients [N, taps, G] (a strided view); h [N, H]
        is blocks of `block` rows packed."""
        c = self.cfg
        dyn = self.k.linear(h, proj).view(h.shape[0], 2, c.conv_kernel_size, c.conv_groups)
        return self.k.dflash_conv(h, dyn[:, 0], base[0], block), dyn[:, 1]
