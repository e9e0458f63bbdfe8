"""Reference vs HF transformers in fp32 on tiny random checkpoints written through transformers' model classes."""

from __future__ import annotations

import pytest
import torch

from ninfer.convert.convert import convert_checkpoint
from ninfer.reference.weights import load_model, load_weights, weights_from_hf_dir
from ninfer.testing.checkpoints import make_hf_checkpoint
from oracle.hf import TOLERANCE, main_hf, run_hf_parity
from oracle.metrics import rel_rms

CONFIGS = {
    "dense-hv2": dict(),
    "dense-tied-hv1": dict(tie=True, hv_per_hk=1),
    "dense-hv3": dict(hv_per_hk=3),
    "dense-multimodal-sharded-hv4": dict(multimodal=True, sharded=True, hv_per_hk=4),
    "moe-hv2": dict(moe=True),
    "moe-tied-multimodal-per-expert-hv1": dict(moe=True, tie=True, multimodal=True, per_expert=True, hv_per_hk=1),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reference_matches_hf(tmp_path, name):
    ckpt = make_hf_checkpoint(tmp_path / name, seed=len(name), **CONFIGS[name])
    # 150 tokens: the chunked GDN crosses two 64-token boundaries.
    report = run_hf_parity(ckpt, num_prompts=1, prompt_len=150, decode_steps=4)
    assert report.weights_source.startswith("convert_checkpoint")
    assert {r.case for r in report.rows} == {"prefill", "prefill-step", "decode"}
    assert [r.positions for r in report.rows] == [150, 150, 4]
    assert report.worst <= TOLERANCE, report.table()


def test_checkpoint_path_bypassing_the_converter(tmp_path):
    ckpt = make_hf_checkpoint(tmp_path / "ck", moe=True, per_expert=True, multimodal=True, hv_per_hk=2)
    report = run_hf_parity(ckpt, num_prompts=1, prompt_len=70, decode_steps=2, via="checkpoint")
    assert report.weights_source.startswith("checkpoint safetensors")
    assert report.worst <= TOLERANCE, report.table()


@pytest.mark.parametrize("opts", [dict(moe=True, per_expert=True, multimodal=True, tie=True), dict(sharded=True)])
def test_artifact_and_checkpoint_weights_agree(tmp_path, opts):
    ckpt = make_hf_checkpoint(tmp_path / "ck", **opts)
    art = convert_checkpoint(ckpt, tmp_path / "a.ninfer", progress=False)
    direct, read = weights_from_hf_dir(ckpt), load_weights(art)
    assert direct.keys() == read.keys()
    assert any(k.startswith("mtp.") for k in read)
    for name in direct:
        assert torch.equal(direct[name], read[name]), name
    model = load_model(art, dtype=torch.float64)
    assert model.has_mtp and model.weights["embed_tokens.weight"].dtype == torch.float64
    assert model.weights["layers.0.linear_attn.A_log"].dtype == torch.float64


def test_main_prints_table_and_worst_line(tmp_path):
    ckpt = make_hf_checkpoint(tmp_path / "ck", num_layers=4)
    lines: list[str] = []
    assert main_hf(ckpt, num_prompts=1, prompt_len=20, decode_steps=2, echo=lines.append) == 0
    assert lines[-1].startswith("worst relative RMS error: ")
    worst = float(lines[-1].split(": ")[1])
    assert 0 < worst <= TOLERANCE
    assert any(line.startswith("decode") for line in "\n".join(lines).splitlines())
    # An impossible tolerance must fail with a non-zero exit code and still end with the worst line.
    lines.clear()
    assert main_hf(ckpt, num_prompts=1, prompt_len=20, decode_steps=0, tolerance=1e-30, echo=lines.append) == 1
    assert lines[-1].startswith("worst relative RMS error: ")


def test_rel_rms():
    b = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert rel_rms(b, b) == 0.0
    assert abs(rel_rms(b + torch.tensor([0.3, 0.4], dtype=torch.float64), b) - 0.1) < 1e-12
    with pytest.raises(ValueError, match="shapes differ"):
        rel_rms(b, torch.zeros(3))


def test_released_head_geometry_in_memory():
    """Per-head sizes of the released models (head_dim 256, rotary 64 with mrope [11, 11, 10], dk = dv = 128,
    theta 1e7) with few heads, so dimension-specific slips (rotary split, l2norm axis) show up."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from ninfer.models.qwen3_5.config import Qwen35Config
    from ninfer.reference.model import ReferenceModel

    hf_cfg = Qwen3_5TextConfig(
        vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
        head_dim=256, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
        linear_value_head_dim=128, intermediate_size=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.1)
    weights = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    cfg = Qwen35Config.from_hf(hf_cfg.to_dict())
    assert cfg.rotary_dim == 64
    ref = ReferenceModel(cfg, weights)
    toks = torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expect = hf(input_ids=toks[None]).logits[0]
    assert rel_rms(ref.prefill(toks, ref.new_state()), expect) <= TOLERANCE
