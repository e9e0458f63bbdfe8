"""Norms, RoPE, attention and the MoE block against direct hand-written formulas."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.reference.attention import apply_rope, causal_attention
from ninfer.reference.ffn import moe, route
from ninfer.reference.norms import gated_rms_norm, zc_rms_norm
from ninfer.reference.rope import rope_cos_sin
from ninfer.reference.scope import Scope

G = torch.Generator().manual_seed(7)


def _r(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def test_zero_centred_norm_uses_one_plus_w():
    x, w = _r(3, 16), _r(16)
    rms = (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    assert torch.allclose(zc_rms_norm(x, w, 1e-6), x / rms * (1 + w), atol=1e-14)
    assert torch.allclose(zc_rms_norm(x, torch.zeros(16, dtype=torch.float64), 1e-6), x / rms, atol=1e-14)


def test_gated_norm_uses_plain_w_and_silu_gate():
    x, z, w = _r(3, 16), _r(3, 16), _r(16)
    rms = (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    assert torch.allclose(gated_rms_norm(x, z, w, 1e-6), w * x / rms * z * torch.sigmoid(z), atol=1e-14)


def test_partial_rope_rotates_only_the_first_dims_and_is_relative():
    d, rd = 32, 8
    q, k = _r(1, 1, d), _r(1, 1, d)
    pos = torch.tensor([5, 12, 105, 112])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))  # [rd/2]
    cos, sin = rope_cos_sin(pos, inv_freq, 1.0, torch.float64)
    qr = apply_rope(q.expand(1, 4, d), cos, sin)[0]  # [4, d]
    kr = apply_rope(k.expand(1, 4, d), cos, sin)[0]
    assert torch.equal(qr[:, rd:], q[0, 0, rd:].expand(4, -1))
    assert torch.allclose(qr.norm(dim=-1), q[0, 0].norm().expand(4))
    # The score depends only on the distance (12-5 == 112-105).
    assert torch.allclose(qr[1] @ kr[0], qr[3] @ kr[2], atol=1e-12)
    # Dims i and i + rd/2 form one rotation pair (NeoX rotate_half): at angle theta, (a, b) -> (a c - b s, b c + a s).
    angle = torch.tensor(5.0, dtype=torch.float64)  # position 5 times inv_freq[0] = 1
    c, s = angle.cos(), angle.sin()
    a, b = q[0, 0, 0], q[0, 0, rd // 2]
    assert torch.allclose(qr[0, 0], a * c - b * s) and torch.allclose(qr[0, rd // 2], b * c + a * s)


def test_causal_gqa_attention_matches_per_head_loop():
    nh, nkv, T, start, d = 4, 2, 3, 2, 8
    q, k, v = _r(nh, T, d), _r(nkv, start + T, d), _r(nkv, start + T, d)
    out = causal_attention(q, k, v, start)
    for h in range(nh):
        j = h // (nh // nkv)
        for t in range(T):
            n = start + t + 1  # keys at positions <= the query's
            p = torch.softmax(k[j, :n] @ q[h, t] / d ** 0.5, dim=0)
            assert torch.allclose(out[h, t], p @ v[j, :n], atol=1e-13)


def test_router_renormalises_top_k():
    x, wr = _r(5, 16), _r(6, 16)
    w, idx = route(x, wr, 2, renormalize=True)
    assert torch.allclose(w.sum(-1), torch.ones(5, dtype=torch.float64))
    probs = torch.softmax(x @ wr.T, -1)
    assert torch.equal(idx, probs.topk(2, dim=-1).indices)
    w_raw, _ = route(x, wr, 2, renormalize=False)
    assert torch.allclose(w_raw, probs.topk(2, dim=-1).values)


def test_moe_block_matches_per_token_loop(tiny_config, random_weights):
    cfg = tiny_config(moe=True)
    weights = {k: v.double() for k, v in random_weights(cfg).items()}
    w = Scope(weights, "layers.0.mlp")
    x = _r(7, cfg.hidden_size)
    Im = cfg.moe_intermediate_size
    expect = torch.zeros_like(x)
    for t in range(7):
        p = torch.softmax(w["gate.weight"] @ x[t], 0)
        top = p.topk(cfg.num_experts_per_tok)
        for pe, e in zip(top.values / top.values.sum(), top.indices):
            gu = w["experts.gate_up_proj"][e] @ x[t]
            expect[t] += pe * (w["experts.down_proj"][e] @ (F.silu(gu[:Im]) * gu[Im:]))
        shared = w["shared_expert.down_proj.weight"] @ (F.silu(w["shared_expert.gate_proj.weight"] @ x[t])
                                                        * (w["shared_expert.up_proj.weight"] @ x[t]))
        expect[t] += torch.sigmoid(w["shared_expert_gate.weight"] @ x[t]) * shared
    assert torch.allclose(moe(x, w, cfg), expect, atol=1e-12)
