"""Broken checkpoints: every problem in one ConversionError, and no output file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from ninfer.artifact import open_artifact
from ninfer.convert.convert import convert_checkpoint
from ninfer.convert.errors import ConversionError
from ninfer.testing.checkpoints import read_checkpoint_tensors


def _rewrite(src, edit):
    tensors = read_checkpoint_tensors(src)
    edit(tensors)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})


def test_all_problems_reported_together(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint(moe=True, per_expert=True)

    def edit(t):
        del t["model.norm.weight"]
        del t["model.layers.1.mlp.experts.2.up_proj.weight"]
        t["model.layers.0.linear_attn.in_proj_z.weight"] = torch.zeros(7, 64)
        t["model.layers.0.mlp.experts.9.down_proj.weight"] = torch.zeros(64, 32)
        t["model.layers.0.linear_attn.extra_bias"] = torch.zeros(4)
        t["vision_tower.weight"] = torch.zeros(2)
        t["mtp.layers.0.input_layernorm.weight"] = torch.zeros(3)
    _rewrite(src, edit)
    out = tmp_path / "out" / "m.ninfer"
    with pytest.raises(ConversionError) as e:
        convert_checkpoint(src, out, progress=False)
    msg = str(e.value)
    for needle in ("missing tensor 'norm.weight'",
                   "'layers.1.mlp.experts.gate_up_proj': expert 2 up_proj",
                   "'model.layers.0.linear_attn.in_proj_z.weight' has shape [7, 64], expected [64, 64]",
                   "unexpected tensor 'model.layers.0.mlp.experts.9.down_proj.weight'",
                   "unexpected tensor 'model.layers.0.linear_attn.extra_bias'",
                   "unexpected tensor 'vision_tower.weight'",
                   "'mtp.layers.0.input_layernorm.weight' has shape [3]"):
        assert needle in msg, needle
    assert len(e.value.problems) == 7
    assert not out.exists() and not (tmp_path / "out").exists()


def test_unsupported_dtype(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint()
    _rewrite(src, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].to(torch.int8)))
    with pytest.raises(ConversionError, match="'model.norm.weight' has unsupported dtype I8"):
        convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)


def test_mtp_absent_is_fine(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint(mtp=False)
    cfg = json.loads((src / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1  # the config announces MTP, the weights do not carry it
    (src / "config.json").write_text(json.dumps(cfg))
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        assert art.available_features == ("text",)
    with pytest.raises(Exception, match="feature 'mtp': not available"):
        open_artifact(out, ("text", "mtp"))


def test_missing_lm_head_means_tied(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint()
    _rewrite(src, lambda t: t.pop("lm_head.weight"))
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        assert art.config.tie_word_embeddings
        assert art.bindings["lm_head.weight"].object == "embed_tokens.weight"
        assert art.provenance["tied_lm_head"] == "lm_head.weight absent"


def test_missing_files(tmp_path, fresh_checkpoint):
    with pytest.raises(ConversionError, match="config.json not found"):
        convert_checkpoint(tmp_path, tmp_path / "m.ninfer", progress=False)
    src = fresh_checkpoint(sharded=True)
    (src / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ConversionError, match="shard 'model-00002-of-00003.safetensors'"):
        convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    assert not (tmp_path / "m.ninfer").exists()


def test_bad_config(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint()
    cfg = json.loads((src / "config.json").read_text())
    cfg["hidden_act"] = "mish"  # an ACT2FN name ninfer does not compute
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="config.json: config field 'hidden_act'"):
        convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)


@pytest.mark.parametrize("broken", ["not json", "string hidden_size"])
def test_malformed_config_is_a_conversion_error(tmp_path, fresh_checkpoint, broken):
    src = fresh_checkpoint()
    if broken == "not json":
        (src / "config.json").write_text("{not json")
    else:
        cfg = json.loads((src / "config.json").read_text())
        cfg.get("text_config", cfg)["hidden_size"] = "big"
        (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "o" / "m.ninfer"
    with pytest.raises(ConversionError, match="config.json"):
        convert_checkpoint(src, out, progress=False)
    assert not out.exists()


def test_failure_while_streaming_leaves_nothing(tmp_path, fresh_checkpoint, monkeypatch):
    src = fresh_checkpoint()
    from ninfer.convert import hf_source

    calls = {"n": 0}
    real = hf_source.HFSource.chunks

    def flaky(self, key, dtype):
        calls["n"] += 1
        if calls["n"] == 20:
            raise OSError("disk read error")
        return real(self, key, dtype)

    monkeypatch.setattr(hf_source.HFSource, "chunks", flaky)
    with pytest.raises(OSError, match="disk read error"):
        convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
