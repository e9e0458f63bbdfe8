"""Quantized checkpoints that cannot be imported exactly are refused with the tensor and field named, and no output
(not even a temp file) is left behind."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

from ninfer.convert.convert import convert_checkpoint
from ninfer.convert.errors import ConversionError
from ninfer.testing.checkpoints import read_checkpoint_tensors
from ninfer.testing.quant_checkpoints import make_quantized_checkpoint

O_PROJ = "model.layers.3.self_attn.o_proj"


def _edit(d, *, drop=(), config=None):
    tensors = {k: v for k, v in read_checkpoint_tensors(d).items() if k not in drop}
    save_file(tensors, str(d / "model.safetensors"))
    if config:
        raw = json.loads((d / "config.json").read_text())
        raw["quantization_config"].update(config)
        (d / "config.json").write_text(json.dumps(raw))
    return d


@pytest.mark.parametrize("method, opts, drop, config, needle", [
    ("gptq", {}, (), {"quant_method": "bitsandbytes"}, "quantization_config.quant_method: 'bitsandbytes'"),
    ("gptq", {}, (), {"bits": 3}, "quantization_config.bits: 3 is not supported"),
    ("fp8", {}, (), {"activation_scheme": "static"}, "quantization_config.activation_scheme: 'static'"),
    ("gptq", {}, (), {"group_size": 48}, f"tensor {O_PROJ}: quantization_config group_size 48 does not divide "
                                         "its input dim 128"),
    ("fp8", {}, (f"{O_PROJ}.weight_scale_inv",), None, f"{O_PROJ}.weight_scale_inv is missing"),
    ("awq", {}, (f"{O_PROJ}.scales",), None, f"{O_PROJ}.scales is missing"),
    ("modelopt", {}, (f"{O_PROJ}.weight_scale_2",), None, f"{O_PROJ}.weight_scale_2 is missing"),
    ("gptq", {}, (f"{O_PROJ}.g_idx",), None, f"tensor {O_PROJ}.qweight: act-order \\(quantization_config.desc_act\\) "
                                           f"without {O_PROJ}.g_idx"),
    ("compressed-tensors", {"act_order": True}, (f"{O_PROJ}.weight_g_idx",), None,
     f"act-order \\(actorder\\) without {O_PROJ}.weight_g_idx"),
    ("compressed-tensors", {"symmetric": False}, (f"{O_PROJ}.weight_zero_point",), None,
     f"{O_PROJ}.weight_zero_point is missing"),
])
def test_refused_with_tensor_and_field_named(tmp_path, method, opts, drop, config, needle):
    d = _edit(make_quantized_checkpoint(tmp_path / "src", method, **opts), drop=drop, config=config)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConversionError, match=needle) as e:
        convert_checkpoint(d, out / "m.ninfer", progress=False)
    assert not any("missing tensor" in p for p in e.value.problems)  # a refused module is not reported twice
    assert list(out.iterdir()) == []


def test_act_order_experts_with_different_g_idx_are_refused(tmp_path):
    d = make_quantized_checkpoint(tmp_path / "src", "gptq", moe=True, act_order=True)
    with pytest.raises(ConversionError, match="act-order g_idx differs between the matrices fused into "
                                              "'layers.0.mlp.experts.gate_up_proj'"):
        convert_checkpoint(d, tmp_path / "m.ninfer", progress=False)
    assert not (tmp_path / "m.ninfer").exists()


def test_a_quantized_checkpoint_takes_no_recipe(tmp_path):
    d = make_quantized_checkpoint(tmp_path / "src", "awq")
    with pytest.raises(ConversionError, match="already quantized"):
        convert_checkpoint(d, tmp_path / "m.ninfer", quantize="q4", progress=False)
