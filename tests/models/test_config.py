"""Config parsing from HF config.json variants, and the capacity queries both Programs share."""

import pytest

from ninfer.models.qwen3_5 import ConfigError, Qwen35Config, logical_parameters
from ninfer.models.qwen3_5.capacity import (
    gdn_state_bytes_per_layer, gdn_state_bytes_per_sequence, kv_bytes_per_token_all_layers, kv_pages_for_tokens,
    weight_bytes, weight_bytes_per_layer)

# Published shapes (qwen35-architecture.md section 1.2).
QWEN35_08B = dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=8, num_key_value_heads=2, intermediate_size=3584, linear_num_value_heads=16,
                  tie_word_embeddings=True, mtp_num_hidden_layers=1)
QWEN35_35B_A3B = dict(model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                      num_attention_heads=16, num_key_value_heads=2, linear_num_value_heads=32, num_experts=256,
                      num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)


def test_text_config_defaults_and_layer_pattern():
    cfg = Qwen35Config.from_hf(QWEN35_08B)
    assert cfg.architecture == "Qwen3_5ForCausalLM" and not cfg.is_moe
    assert cfg.attention_layers == (3, 7, 11, 15, 19, 23)
    # transformers' defaults: theta 10000 (RotaryEmbeddingConfigMixin), 32768 positions, mrope [11, 11, 10].
    assert cfg.rotary_dim == 64 and cfg.mrope_section == (11, 11, 10) and cfg.rope_theta == 10000.0
    assert cfg.max_position_embeddings == 32768
    assert cfg.conv_dim == 2 * 16 * 128 + 16 * 128 == 6144


def test_nested_multimodal_config_with_new_rope_placement_and_top_level_tie():
    raw = {"model_type": "qwen3_5", "tie_word_embeddings": True,
           "vision_config": {"depth": 2, "out_hidden_size": QWEN35_08B["hidden_size"]},
           "text_config": {**QWEN35_08B, "model_type": "qwen3_5_text", "tie_word_embeddings": False,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5,
                                               "mrope_section": [22, 22, 20], "mrope_interleaved": True}}}
    cfg = Qwen35Config.from_hf(raw)
    assert cfg.tie_word_embeddings and cfg.has_vision
    assert cfg.rope_theta == 5e6 and cfg.rotary_dim == 128
    v = cfg.vision
    assert (v.depth, v.hidden_size, v.patch_size, v.temporal_patch_size, v.spatial_merge_size, v.grid_side) == \
        (2, 1152, 16, 2, 2, 48)
    assert (v.image_token_id, v.vision_start_token_id, v.head_dim, v.patch_dim) == (248056, 248053, 72, 1536)
    assert Qwen35Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("vision, field", [
    ({"out_hidden_size": 7}, "vision_config.out_hidden_size"),
    ({"num_position_embeddings": 2300}, "vision_config.num_position_embeddings"),
    ({"hidden_size": 36, "num_heads": 2, "out_hidden_size": 1024}, "vision_config.hidden_size"),
    ({"rope_parameters": {"rope_type": "default"}, "out_hidden_size": 1024}, "vision_config.rope_parameters.rope_type"),
])
def test_bad_vision_geometry_is_refused_naming_the_field(vision, field):
    raw = {"model_type": "qwen3_5", "vision_config": vision, "text_config": {**QWEN35_08B, "model_type": "qwen3_5_text"}}
    with pytest.raises(ConfigError) as e:
        Qwen35Config.from_hf(raw)
    assert e.value.field == field


def test_old_top_level_rope_fields_and_explicit_layer_types():
    raw = {**QWEN35_08B, "num_hidden_layers": 3, "rope_theta": 1234.0, "partial_rotary_factor": 0.25,
           "layer_types": ["full_attention", "linear_attention", "full_attention"]}
    cfg = Qwen35Config.from_hf(raw)
    assert cfg.rope_theta == 1234.0 and cfg.attention_layers == (0, 2)


def test_moe_config_and_round_trip_through_descriptor_form():
    cfg = Qwen35Config.from_hf(QWEN35_35B_A3B)
    assert cfg.is_moe and cfg.num_experts == 256 and cfg.intermediate_size == 0
    assert Qwen35Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("patch,field", [
    ({"model_type": "llama"}, "model_type"),
    ({"layer_types": ["linear_attention"]}, "layer_types"),
    ({"layer_types": ["mamba"] * 24}, "layer_types"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"linear_num_key_heads": 16, "linear_num_value_heads": 24}, "linear_num_value_heads"),
    ({"hidden_act": "mish"}, "hidden_act"),
    ({"hidden_size": None}, "hidden_size"),
    ({"rope_parameters": {"rope_type": "linear"}}, "rope_parameters.factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_parameters.rope_type"),
    ({"rope_parameters": {"rope_type": "su"}}, "rope_parameters.rope_type"),
    ({"rope_parameters": {"mrope_section": [8, 8]}}, "rope_parameters.mrope_section"),
    ({"head_dim": None}, "head_dim"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
])
def test_inconsistent_or_unknown_fields_name_the_field(patch, field):
    raw = {**QWEN35_08B, **patch}
    with pytest.raises(ConfigError) as e:
        Qwen35Config.from_hf(raw)
    assert e.value.field == field and field in str(e.value)


def test_capacity_queries_match_published_state_sizes():
    small = Qwen35Config.from_hf(QWEN35_08B)
    assert kv_bytes_per_token_all_layers(small) == 12 * 1024
    assert gdn_state_bytes_per_layer(small).recurrent == 2**20
    nine_b = Qwen35Config.from_hf(dict(QWEN35_08B, hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
                                       num_key_value_heads=4, intermediate_size=12288, linear_num_value_heads=32,
                                       tie_word_embeddings=False))
    assert kv_bytes_per_token_all_layers(nine_b) == 32 * 1024
    assert gdn_state_bytes_per_sequence(nine_b) == 24 * (2 * 2**20 + 8192 * 3 * 2)


def test_weight_bytes_count_tied_embedding_once_and_layers_sum_up():
    cfg = Qwen35Config.from_hf(QWEN35_08B)
    params = logical_parameters(cfg, ("text",))
    emb = params["embed_tokens.weight"].numel * 2
    per_layer = weight_bytes_per_layer(cfg)
    assert len(per_layer) == 24 and all(b > 0 for b in per_layer)
    globals_ = emb + 1024 * 2  # embedding (= tied lm_head) + final norm
    assert weight_bytes(cfg) == sum(per_layer) + globals_
    # A_log and dt_bias stay fp32 whatever the weight dtype.
    assert weight_bytes(cfg, "float32") - 2 * weight_bytes(cfg, "bfloat16") == -18 * 2 * 16 * 4


def test_mtp_parameters_are_a_full_attention_layer():
    cfg = Qwen35Config.from_hf(QWEN35_08B)
    mtp = {k: v for k, v in logical_parameters(cfg).items() if k.startswith("mtp.")}
    assert mtp["mtp.fc.weight"].shape == (1024, 2048)
    assert "mtp.layers.0.self_attn.q_proj.weight" in mtp and "mtp.layers.0.mlp.gate_proj.weight" in mtp
    assert all(v.feature == "mtp" for v in mtp.values())


@pytest.mark.parametrize("tokens,page,pages", [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2)])
def test_kv_pages_for_tokens(tokens, page, pages):
    assert kv_pages_for_tokens(tokens, page) == pages
