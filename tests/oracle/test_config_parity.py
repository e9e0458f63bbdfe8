"""Configs as transformers writes them, and as older or hand-written checkpoints carry them, read the way
transformers reads them: the reference model (through the converter) matches HF transformers' logits on tiny random
checkpoints that `save_pretrained` wrote, over head dims, partial rotary factors, mrope sections, scaled RoPE
types and the optional or defaulted fields."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.reference.weights import hf_config
from ninfer.testing.checkpoints import save_hf_checkpoint, tiny_text_config
from oracle.hf import TOLERANCE, run_hf_parity


def _text_kw(head_dim: int, rope: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    kw = tiny_text_config(vocab=320)
    kw.pop("rope_parameters")  # transformers fills in its own defaults, as for a config that names none
    kw.update(head_dim=head_dim, **extra)
    if rope is not None:
        kw["rope_parameters"] = rope
    return kw


def _drop(*keys: str) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        for key in keys:
            config.pop(key, None)
    return edit


# A small theta makes every frequency pair turn within the prompt, so a slip in any of them shows.
THETA = 100.0
# (head_dim, partial_rotary_factor): rotary dims 4, 8, 16, 24 (full), 14 and 9 (odd: transformers rounds it up).
GEOMETRIES = [(16, 0.25), (32, 0.25), (32, 0.5), (24, 1.0), (48, 0.3), (36, 0.25)]


@pytest.mark.parametrize("mrope", ["absent", "mismatched", "matching"])
@pytest.mark.parametrize("head_dim,factor", GEOMETRIES)
def test_rotary_geometry_with_and_without_mrope_section(tmp_path, head_dim, factor, mrope):
    rope = {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": factor}
    half = int(head_dim * factor + 1) // 2
    if mrope == "mismatched":
        rope["mrope_section"] = [11, 11, 10]  # the released models' section, whatever this rotary dim is
    elif mrope == "matching":
        rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    ckpt = save_hf_checkpoint(tmp_path / "ck", _text_kw(head_dim, rope), seed=head_dim)
    report = run_hf_parity(ckpt, num_prompts=1, prompt_len=24, decode_steps=2)
    assert report.worst <= TOLERANCE, report.table()


def _rename_rope_to_scaling(config: dict) -> None:
    config["rope_scaling"] = config.pop("rope_parameters")


def _rope_fields_top_level(config: dict) -> None:
    rope = config.pop("rope_parameters")
    config["rope_theta"], config["partial_rotary_factor"] = rope["rope_theta"], rope["partial_rotary_factor"]


def _torch_dtype(config: dict) -> None:
    config["torch_dtype"] = config.pop("dtype", "float32")


def _both_dtypes(config: dict) -> None:
    config["torch_dtype"] = "bfloat16"  # transformers 5 reads "dtype"; the safetensors hold fp32 either way


def _gate_flag_off(config: dict) -> None:
    config["attn_output_gate"] = False  # not read by transformers: the weights are gated


def _interval_only(config: dict) -> None:
    config.pop("layer_types")
    config["full_attention_interval"] = 2  # layers 1 and 3 attend, as the model was built


VARIANTS: dict[str, tuple[dict[str, Any], Callable[[dict], None] | None]] = {
    # as written by transformers 5 for a config naming no RoPE fields: theta 10000, factor 0.25, no mrope_section
    "transformers-defaults": (_text_kw(32), None),
    "rope_scaling-old-name": (_text_kw(32, {"rope_type": "default", "rope_theta": THETA}), _rename_rope_to_scaling),
    "rope-fields-top-level": (_text_kw(32, {"rope_type": "default", "rope_theta": THETA,
                                            "partial_rotary_factor": 0.5}), _rope_fields_top_level),
    "rope-absent": (_text_kw(32), _drop("rope_parameters")),
    "linear": (_text_kw(32, {"rope_type": "linear", "rope_theta": THETA, "factor": 4.0}), None),
    "yarn": (_text_kw(32, {"rope_type": "yarn", "rope_theta": THETA, "factor": 8.0,
                           "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5}), None),
    "yarn-mscale-beta": (_text_kw(32, {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "mscale": 2.0,
                                       "mscale_all_dim": 1.0, "beta_fast": 8, "beta_slow": 2, "truncate": False,
                                       "original_max_position_embeddings": 16, "partial_rotary_factor": 1.0}), None),
    "llama3": (_text_kw(32, {"rope_type": "llama3", "rope_theta": THETA, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8,
                             "partial_rotary_factor": 1.0}), None),
    "proportional": (_text_kw(32, {"rope_type": "proportional", "rope_theta": THETA, "partial_rotary_factor": 0.5,
                                   "factor": 2.0}), None),
    "head_dim-absent": (_text_kw(256), _drop("head_dim")),
    "layer_types-absent": (_text_kw(32), _drop("layer_types")),
    "layer_types-from-interval": (_text_kw(32, full_attention_interval=2), _interval_only),
    "tied-embeddings": (_text_kw(32, tie_word_embeddings=True), None),
    "torch_dtype-instead-of-dtype": (_text_kw(32), _torch_dtype),
    "torch_dtype-and-dtype": (_text_kw(32), _both_dtypes),
    "attn_output_gate-false": (_text_kw(32), _gate_flag_off),
    "max_position_embeddings-absent": (_text_kw(32), _drop("max_position_embeddings")),
    "hidden_act-gelu": (_text_kw(32, hidden_act="gelu"), None),
    "attention_bias": (_text_kw(32, attention_bias=True), None),
    "hidden_act-gelu_pytorch_tanh": (_text_kw(32, hidden_act="gelu_pytorch_tanh"), None),
    "hidden_act-gelu_new": (_text_kw(32, hidden_act="gelu_new"), None),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_optional_and_defaulted_fields_read_as_transformers_reads_them(tmp_path, name):
    from transformers import AutoConfig

    text_kw, edit = VARIANTS[name]
    ckpt = save_hf_checkpoint(tmp_path / name, text_kw, seed=len(name), edit=edit)
    report = run_hf_parity(ckpt, num_prompts=1, prompt_len=24, decode_steps=2)
    assert report.worst <= TOLERANCE, report.table()
    # The fields that shape no logits here still mean what they mean to transformers.
    ours, theirs = hf_config(ckpt), AutoConfig.from_pretrained(str(ckpt))
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert list(ours.layer_types) == theirs.layer_types and ours.head_dim == theirs.head_dim
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings


@pytest.mark.parametrize("top", [None, True, False])
@pytest.mark.parametrize("inner", [None, True, False])
def test_tie_placement_of_a_multimodal_config_follows_transformers(top, inner):
    """A nested (ForConditionalGeneration) config ties by its top-level flag alone, default untied."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(_text_kw(32), model_type="qwen3_5_text", num_hidden_layers=1, layer_types=["full_attention"])
    text.pop("tie_word_embeddings")
    if inner is not None:
        text["tie_word_embeddings"] = inner
    raw = {"model_type": "qwen3_5", "text_config": text,
           "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64,
                             "intermediate_size": 32}}
    if top is not None:
        raw["tie_word_embeddings"] = top
    with torch.device("meta"):
        hf = Qwen3_5ForConditionalGeneration(Qwen3_5Config.from_dict(raw))
    tied = hf.lm_head.weight is hf.model.language_model.embed_tokens.weight
    assert Qwen35Config.from_hf(raw).tie_word_embeddings == tied


@pytest.mark.parametrize("moe", [False, True])
def test_a_config_naming_nothing_takes_transformers_defaults(moe):
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    theirs = (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)()
    ours = Qwen35Config.from_hf({"model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
                                 "norm_topk_prob": False})  # not read: transformers' router always renormalises
    names = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim", "rms_norm_eps", "max_position_embeddings",
             "tie_word_embeddings", "hidden_act", "attention_bias"]
    names += (["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"]
              if moe else ["intermediate_size"])
    for name in names:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert list(ours.layer_types) == theirs.layer_types and ours.norm_topk_prob
    rope = theirs.rope_parameters
    assert (ours.rope_theta, ours.partial_rotary_factor, ours.rope_type) == (
        rope["rope_theta"], rope["partial_rotary_factor"], rope["rope_type"])
