"""The reference DFlash / DFlash2 drafter against the published forward written out here independently: the
context and the block in one pass (transformers' Qwen3 RMSNorm and RoPE, K/V of [context ; block], no mask),
DFlash2's convolution as shifted copies and its selector as the explicit edge formula. The drafter builds its
context incrementally (in pieces, under a window), so any piece, position or window mistake shows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig, DrafterKind
from ninfer.reference.dflash import Drafter
from ninfer.reference.dflash_selector import CandidateSelector
from ninfer.testing.drafters import drafter_hf_config, drafter_tensors

V, H = 40, 32


def _target() -> Qwen35Config:
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=V, hidden_size=H, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, intermediate_size=32, tie_word_embeddings=False))


def _drafter(kind: str, **config) -> tuple[Drafter, dict]:
    raw = drafter_hf_config(_target(), kind, layers=2, block_size=8, **config)
    cfg = DrafterConfig.from_hf(raw)
    w = {k: v.double() for k, v in drafter_tensors(cfg, seed=4).items()}
    g = torch.Generator().manual_seed(5)
    embed, head = torch.randn(V, H, generator=g, dtype=torch.float64), torch.randn(V, H, generator=g,
                                                                                 dtype=torch.float64)
    return Drafter(cfg, w, embed, head, torch.float64), raw


def _norm(w: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    n = Qwen3RMSNorm(w.shape[0], eps=eps).double()
    n.weight.data = w.clone()
    return n(x)


def _published_conv(x, dyn, base, gs):
    """out[i, c] = sum_t (base[t, c] + dyn[i, t, c // gs]) * x[i - t, c], as shifted copies."""
    out = torch.zeros_like(x)
    for t in range(base.shape[0]):
        shifted = torch.cat([torch.zeros(t, x.shape[1], dtype=x.dtype), x[:x.shape[0] - t]])
        out += (base[t] + dyn[:, t].repeat_interleave(gs, dim=-1)) * shifted
    return out


def _published(d: Drafter, raw: dict, taps: torch.Tensor, anchor: int, B: int, first: int) -> torch.Tensor:
    """The drafts' logits of one pass over [context positions first.. ; block] (positions of the context are
    absolute: first .. first + T - 1; the block follows). Tolerances are 1e-4: transformers builds the RoPE angles
    in fp32, the drafter in fp64 mode in fp64."""
    c, w, eps = d.cfg, d.root.weights, d.cfg.rms_norm_eps
    T = taps.shape[0]
    rot = Qwen3RotaryEmbedding(Qwen3Config(hidden_size=H, num_attention_heads=2, head_dim=c.head_dim,
                                           rope_theta=raw["rope_theta"]))
    pos = torch.arange(first, first + T + B)[None]
    cos, sin = (t[0].double() for t in rot(torch.zeros(1, dtype=torch.float64), pos))  # [T + B, d]
    ctx = _norm(w["dflash.hidden_norm.weight"], taps @ w["dflash.fc.weight"].T, eps)
    x = d.embed[torch.tensor([anchor] + [c.mask_token_id] * (B - 1))]
    for i in range(c.num_hidden_layers):
        p = f"dflash.layers.{i}."

        def conv(h, side, name):
            dyn = (h @ w[p + name + ".kernel_projection.weight"].T).view(B, 2, c.conv_kernel_size, c.conv_groups)
            return dyn, _published_conv(h, dyn[:, side], w[p + name + ".base_kernel"][side], c.conv_group_size)

        h = _norm(w[p + "input_layernorm.weight"], x, eps)
        if c.kind is DrafterKind.DFLASH2:
            dyn, h = conv(h, 0, "attention_conv")
        q = _norm(w[p + "self_attn.q_norm.weight"], (h @ w[p + "self_attn.q_proj.weight"].T).view(B, 2, -1), eps)
        kv_in = torch.cat([ctx, h])
        k = _norm(w[p + "self_attn.k_norm.weight"], (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(T + B, 1, -1),
                  eps)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(T + B, 1, -1)
        q = q * cos[-B:, None] + rotate_half(q) * sin[-B:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        att = torch.softmax(torch.einsum("bhd,shd->hbs", q, k.expand(-1, 2, -1)) * c.head_dim ** -0.5, dim=-1)
        a = torch.einsum("hbs,shd->bhd", att, v.expand(-1, 2, -1)).reshape(B, -1) @ w[p + "self_attn.o_proj.weight"].T
        if c.kind is DrafterKind.DFLASH2:
            a = _published_conv(a, dyn[:, 1], w[p + "attention_conv.base_kernel"][1], c.conv_group_size)
        x = x + a
        h = _norm(w[p + "post_attention_layernorm.weight"], x, eps)
        if c.kind is DrafterKind.DFLASH2:
            dyn, h = conv(h, 0, "mlp_conv")
        m = (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
        if c.kind is DrafterKind.DFLASH2:
            m = _published_conv(m, dyn[:, 1], w[p + "mlp_conv.base_kernel"][1], c.conv_group_size)
        x = x + m
    return _norm(w["dflash.norm.weight"], x, eps)[1:] @ d.lm_head.T


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("window", [None, 4])
def test_drafter_equals_the_published_forward(kind, window):
    d, raw = _drafter(kind)
    g = torch.Generator().manual_seed(6)
    taps = torch.randn(9, len(d.cfg.target_layer_ids) * H, generator=g, dtype=torch.float64)
    ctx = d.empty_context()
    for lo, hi in ((0, 5), (5, 6), (6, 9)):  # a prefill chunk, a decode step, a verified block
        d.extend(ctx, taps[lo:hi], lo, window)
    before = [c.k.clone() for c in ctx.kv]
    logits, hidden = d.block(ctx, anchor=3, block_size=8)
    first = 0 if window is None else 9 - window
    want = _published(d, raw, taps[first:], 3, 8, first)
    assert logits.shape == (7, V) and hidden.shape == (7, H)
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    assert ctx.end == 9 and ctx.start == first and all(torch.equal(a.k, b) for a, b in zip(ctx.kv, before))


def test_a_shorter_block_reads_the_same_context():
    """A run with 7 drafts (block 8) of a block-16 drafter: one pass over 8 slots at the same positions."""
    d, raw = _drafter("dflash2")
    taps = torch.randn(5, len(d.cfg.target_layer_ids) * H, dtype=torch.float64)
    ctx = d.empty_context()
    d.extend(ctx, taps, 0, None)
    torch.testing.assert_close(d.block(ctx, 1, 4)[0], _published(d, raw, taps, 1, 4, 0), rtol=1e-4, atol=1e-4)


def test_selector_scores_are_the_edge_formula():
    d, _ = _drafter("dflash2")
    w = d.root.sub("candidate_selector")
    g = torch.Generator().manual_seed(7)
    logits, hidden = torch.randn(3, V, generator=g, dtype=torch.float64), torch.randn(3, H, generator=g,
                                                                                     dtype=torch.float64)
    sel = CandidateSelector(w, d.cfg.selector_top_k, logits, hidden)
    z = sel.scores(2, previous=11)
    top = torch.topk(logits[2], d.cfg.selector_top_k).indices
    A, Bc, P = w["predecessor_codebook"], w["successor_codebook"], w["hidden_projection.weight"]
    for c in range(V):
        if c in top:
            want = logits[2, c] + torch.dot(A[11] * (P @ hidden[2]), Bc[c])
            torch.testing.assert_close(z[c], want, rtol=1e-12, atol=1e-12)
        else:
            assert z[c] == float("-inf")
