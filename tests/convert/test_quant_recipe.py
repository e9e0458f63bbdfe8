"""Quantizing recipes: which parameters become which representation, the fused parents and their row views, the
Uses' activation permissions, --keep, and the values staying close to the bf16 source."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.artifact import open_artifact
from ninfer.artifact.descriptor import intersect_activations
from ninfer.convert.convert import convert_checkpoint
from ninfer.convert.errors import ConversionError
from ninfer.testing.checkpoints import make_hf_checkpoint

ATTN = "layers.3.self_attn"
GDN = "layers.0.linear_attn"


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    import torch

    return {moe: make_hf_checkpoint(tmp_path_factory.mktemp(f"bf16{moe}"), moe=moe, dtype=torch.bfloat16)
            for moe in (False, True)}


def _convert(bf16, tmp_path, recipe, moe=False, **kw):
    return convert_checkpoint(bf16[moe], tmp_path / f"{recipe}.ninfer", quantize=recipe, group_size=32,
                              progress=False, **kw)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(((a - b) ** 2).mean() / (b ** 2).mean()))


@pytest.mark.parametrize("recipe, fmt, tol", [("fp8", "fp8_e4m3", 0.05), ("q4", "int_group", 0.12),
                                              ("q5", "int_group", 0.06), ("nvfp4", "nvfp4", 0.15)])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_recipe_quantizes_linears_and_keeps_the_rest(bf16, tmp_path, recipe, fmt, tol, moe):
    path = _convert(bf16, tmp_path, recipe, moe)
    with open_artifact(path, features=("text", "mtp")) as art, \
            open_artifact(convert_checkpoint(bf16[moe], tmp_path / "ref.ninfer", progress=False),
                          features=("text", "mtp")) as ref:
        assert art.provenance["recipe"]["name"] == recipe
        for name, b in art.bindings.items():
            o = art.objects[b.object]
            quantized = o.format != "dense"
            small = name.endswith(("in_proj_a.weight", "in_proj_b.weight", "shared_expert_gate.weight"))
            expect_q = b.kind in ("linear", "experts") and len(b.shape) >= 2 and not small
            assert quantized == expect_q, name
            acts = {u.activation for u in art.uses_of(name)}
            assert acts == ({"AllowA8"} if quantized and recipe == "fp8" else {"A16Only"}), name
            if quantized:
                assert o.format == fmt, name
                assert _rel(art.dequantize(name).numpy(), ref.dequantize(name).numpy()) < tol, name
            else:
                assert art.tensor(name).equal(ref.tensor(name)), name


def _parent(art, name):
    b = art.bindings[name]
    return b.object, b.rows, art.objects[b.object]


def test_q4_puts_q_k_in_an_int4_parent_and_v_in_int5(bf16, tmp_path):
    with open_artifact(_convert(bf16, tmp_path, "q4")) as art:
        q, k, v = (_parent(art, f"{ATTN}.{p}_proj.weight") for p in "qkv")
        assert q[0] == k[0] == f"{ATTN}.qk_proj" and q[2].dtype == "int4"
        assert q[1] == (0, 256) and k[1] == (256, 320) and q[2].shape == (320, 64)
        assert v[0] == f"{ATTN}.v_proj.weight" and v[1] is None and v[2].dtype == "int5"
        # The two-weight projection entry runs with the intersection of its Uses' permissions.
        uses = [u.activation for p in "qkv" for u in art.uses_of(f"{ATTN}.{p}_proj.weight")]
        assert intersect_activations(uses) == "A16Only"


def test_single_parents_form_where_views_align(bf16, tmp_path):
    with open_artifact(_convert(bf16, tmp_path, "q5")) as art:
        assert {_parent(art, f"{ATTN}.{p}_proj.weight")[0] for p in "qkv"} == {f"{ATTN}.qkv_proj"}
        assert {_parent(art, f"{GDN}.in_proj_{p}.weight")[0] for p in ("qkv", "z")} == {f"{GDN}.in_proj_qkvz"}
    with open_artifact(_convert(bf16, tmp_path, "fp8")) as art:
        # 128x128 blocks: q|k ends at row 320, not a block boundary, so q, k, v stand alone; gate|up at 128 fuse.
        assert {_parent(art, f"{ATTN}.{p}_proj.weight")[1] for p in "qkv"} == {None}
        gate, up = (_parent(art, f"layers.0.mlp.{p}_proj.weight") for p in ("gate", "up"))
        assert gate[0] == up[0] == "layers.0.mlp.gate_up_proj" and up[1] == (128, 256)
        assert gate[2].params == {"block": [128, 128]} and gate[2].planes[1].rows_per_entry == 128


def test_fp8_single_parent_holds_q_k_v_in_order_where_blocks_align(tmp_path):
    """Heads of 64 with 2 q and 2 kv heads: q_proj (query+gate) 256 rows, k 128, v 128, all 128-row aligned."""
    from ninfer.testing.quant_checkpoints import write_peaked_checkpoint

    raw = dict(model_type="qwen3_5_text", vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=2, head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2,
               linear_key_head_dim=64, linear_value_head_dim=64, intermediate_size=256, mtp_num_hidden_layers=0)
    src = write_peaked_checkpoint(tmp_path / "src", raw)
    path = convert_checkpoint(src, tmp_path / "fp8.ninfer", quantize="fp8", progress=False)
    with open_artifact(path) as art, open_artifact(convert_checkpoint(src, tmp_path / "b.ninfer", progress=False)) as ref:
        views = [_parent(art, f"{ATTN}.{p}_proj.weight") for p in "qkv"]
        assert {v[0] for v in views} == {f"{ATTN}.qkv_proj"}
        assert [v[1] for v in views] == [(0, 256), (256, 384), (384, 512)]
        assert views[0][2].shape == (512, 128) and views[0][2].planes[1].shape == (4, 1)
        for p in "qkv":
            name = f"{ATTN}.{p}_proj.weight"
            assert [u.activation for u in art.uses_of(name)] == ["AllowA8"]
            assert _rel(art.dequantize(name).numpy(), ref.dequantize(name).numpy()) < 0.05


def test_keep_leaves_matching_modules_dense(bf16, tmp_path):
    path = _convert(bf16, tmp_path, "q4", keep=("layers.0.*", "*.down_proj.weight"))
    with open_artifact(path) as art:
        for name, b in art.bindings.items():
            if name.startswith("layers.0.") or name.endswith("down_proj.weight"):
                assert art.objects[b.object].format == "dense", name
                assert {u.activation for u in art.uses_of(name)} == {"A16Only"}
        assert art.objects[art.bindings["layers.1.mlp.up_proj.weight"].object].format == "int_group"
        assert art.provenance["recipe"]["keep"] == ["layers.0.*", "*.down_proj.weight"]


@pytest.mark.parametrize("kw, needle", [
    (dict(quantize="q4", group_size=48), "--group-size 48 does not divide its input dim 64"),
    (dict(quantize="q4", group_size=32, keep=("nothing.*",)), "--keep 'nothing.*' matches no parameter"),
    (dict(quantize="q7"), "--quantize 'q7' is not a recipe"),
    (dict(keep=("layers.0.*",)), "--keep needs --quantize"),
])
def test_recipe_refusals_leave_nothing(bf16, tmp_path, kw, needle):
    with pytest.raises(ConversionError, match=needle.replace("*", r"\*").replace(".", r"\.")):
        convert_checkpoint(bf16[False], tmp_path / "m.ninfer", progress=False, **kw)
    assert list(tmp_path.iterdir()) == []


def test_fused_experts_source_is_read_once_per_object(bf16, tmp_path, monkeypatch):
    from ninfer.convert.hf_source import HFSource

    reads: list[str] = []
    get = HFSource.get
    monkeypatch.setattr(HFSource, "get", lambda self, key: reads.append(key) or get(self, key))
    _convert(bf16, tmp_path, "q4", moe=True)
    experts = [k for k in reads if "mlp.experts." in k]
    assert experts and len(experts) == len(set(experts))  # not once per expert
