"""Clear errors naming the offending weight, token or option."""

from __future__ import annotations

import pytest
import torch

from ninfer.reference.model import ReferenceModel


def test_missing_weight_is_named(tiny_config, random_weights):
    cfg = tiny_config()
    w = random_weights(cfg)
    del w["layers.1.linear_attn.A_log"]
    with pytest.raises(KeyError, match=r"layers\.1\.linear_attn\.A_log"):
        ReferenceModel(cfg, w)


def test_wrong_shape_is_named(tiny_config, random_weights):
    cfg = tiny_config()
    w = random_weights(cfg)
    w["norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"'norm\.weight' has shape \(3,\)"):
        ReferenceModel(cfg, w)


def test_tied_model_needs_no_lm_head_and_shares_the_embedding(tiny_config, random_weights):
    cfg = tiny_config(tie=True)
    w = random_weights(cfg)
    del w["lm_head.weight"]
    m = ReferenceModel(cfg, w)
    assert m.weights["lm_head.weight"] is m.weights["embed_tokens.weight"]


def test_fp32_kind_parameters_stay_fp32_and_the_rest_cast(tiny_config, random_weights):
    cfg = tiny_config()
    m = ReferenceModel(cfg, random_weights(cfg), dtype=torch.bfloat16)
    assert m.weights["layers.0.linear_attn.A_log"].dtype == torch.float32
    assert m.weights["layers.0.linear_attn.in_proj_qkv.weight"].dtype == torch.bfloat16


def test_bad_inputs(dense64, make_tokens):
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 512\)"):
        dense64.prefill(torch.tensor([1, 512]), dense64.new_state())
    with pytest.raises(ValueError, match="non-empty 1-D"):
        dense64.prefill(torch.zeros(0, dtype=torch.long), dense64.new_state())
    with pytest.raises(ValueError, match="chunked=True"):
        dense64.prefill(make_tokens(4), dense64.new_state(), chunked=False, checkpoints=[])


def test_mtp_without_weights(tiny_config, random_weights):
    cfg = tiny_config()
    w = {k: v for k, v in random_weights(cfg).items() if not k.startswith("mtp.")}
    m = ReferenceModel(cfg, w)
    with pytest.raises(RuntimeError, match="without MTP weights"):
        m.mtp_forward(torch.zeros(1, cfg.hidden_size), torch.tensor([0]), m.new_state())


def test_inconsistent_state_is_refused_before_any_mutation(dense64, make_tokens):
    state = dense64.new_state()
    dense64.prefill(make_tokens(5), state)
    state.next_position = 7
    before = state.clone()
    with pytest.raises(ValueError, match="layer 3 KV holds 5 positions but next_position is 7"):
        dense64.decode_step(1, state)
    assert all(torch.equal(state.gdn[i].recurrent, before.gdn[i].recurrent) for i in state.gdn)
