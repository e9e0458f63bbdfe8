"""The MTP head against a hand-written composition of the primitives, and its own KV continuity."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.reference.attention import apply_rope
from ninfer.reference.ffn import ffn
from ninfer.reference.model import ReferenceModel
from ninfer.reference.norms import zc_rms_norm
from ninfer.reference.rope import rope_cos_sin, rope_frequencies
from ninfer.reference.scope import Scope


def _hand_attention(x: torch.Tensor, W: dict, p: str, model: ReferenceModel) -> torch.Tensor:
    """Gated attention at positions 0..T-1 written out head by head; x [T, H] (already input-normed)."""
    cfg = model.cfg
    T, nh, nkv, d, eps = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    qg = (x @ W[p + "q_proj.weight"].T).view(T, nh, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]
    q = zc_rms_norm(q, W[p + "q_norm.weight"], eps)
    k = zc_rms_norm((x @ W[p + "k_proj.weight"].T).view(T, nkv, d), W[p + "k_norm.weight"], eps)
    v = (x @ W[p + "v_proj.weight"].T).view(T, nkv, d)
    cos, sin = rope_cos_sin(torch.arange(T), *rope_frequencies(cfg, x.dtype), x.dtype)
    q = apply_rope(q.transpose(0, 1), cos, sin)  # [nh, T, d]
    k = apply_rope(k.transpose(0, 1), cos, sin)  # [nkv, T, d]
    o = torch.zeros(T, nh, d, dtype=x.dtype)
    for h in range(nh):
        j = h // (nh // nkv)
        for t in range(T):
            p_att = torch.softmax(k[j, :t + 1] @ q[h, t] / d ** 0.5, dim=0)
            o[t, h] = (p_att @ v.transpose(0, 1)[j, :t + 1]) * torch.sigmoid(gate[t, h])
    return o.reshape(T, nh * d) @ W[p + "o_proj.weight"].T


def _hand_mtp(model: ReferenceModel, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    W, cfg, eps = model.weights, model.cfg, model.cfg.rms_norm_eps
    e = zc_rms_norm(W["embed_tokens.weight"][next_tokens], W["mtp.pre_fc_norm_embedding.weight"], eps)
    hn = zc_rms_norm(hidden, W["mtp.pre_fc_norm_hidden.weight"], eps)
    u = torch.cat([e, hn], dim=-1) @ W["mtp.fc.weight"].T  # embedding first, hidden second
    p = "mtp.layers.0."
    h = u + _hand_attention(zc_rms_norm(u, W[p + "input_layernorm.weight"], eps), W, p + "self_attn.", model)
    h = h + ffn(zc_rms_norm(h, W[p + "post_attention_layernorm.weight"], eps), Scope(W, p + "mlp"), cfg)
    return zc_rms_norm(h, W["mtp.norm.weight"], eps) @ W["lm_head.weight"].T


def test_mtp_forward_matches_hand_composition(model64, make_tokens):
    toks = make_tokens(12, seed=6)
    state = model64.new_state()
    _, hidden = model64.prefill(toks, state, return_hidden=True)
    drafts = model64.mtp_forward(hidden[:-1], toks[1:], state)  # pair h_t with token t+1
    assert drafts.shape == (11, model64.cfg.vocab_size)
    assert torch.allclose(drafts, _hand_mtp(model64, hidden[:-1], toks[1:]), atol=1e-11)
    assert state.mtp_kv[0].length == 11


def test_mtp_kv_continuity_and_chained_hidden(model64, make_tokens):
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(8, model64.cfg.hidden_size, generator=g, dtype=torch.float64)
    nxt = make_tokens(8, seed=9)
    one = model64.mtp_forward(hidden, nxt, model64.new_state())
    state = model64.new_state()
    parts = [model64.mtp_forward(hidden[:5], nxt[:5], state), model64.mtp_forward(hidden[5:], nxt[5:], state)]
    assert torch.allclose(torch.cat(parts), one, atol=1e-12)
    logits, h = model64.mtp_forward(hidden[:1], nxt[:1], model64.new_state(), return_hidden=True)
    assert torch.allclose(F.linear(h, model64.weights["lm_head.weight"]), logits)


def test_last_hidden_is_the_lm_head_input(dense64, make_tokens):
    state = dense64.new_state()
    logits, hidden = dense64.prefill(make_tokens(5), state, return_hidden=True)
    assert torch.equal(state.last_hidden, hidden[-1])
    assert torch.allclose(dense64.logits(hidden), logits)
    step_logits, step_hidden = dense64.decode_step(3, state, return_hidden=True)
    assert torch.equal(state.last_hidden, step_hidden) and step_logits.shape == (dense64.cfg.vocab_size,)
