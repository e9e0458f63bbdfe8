"""write_artifact / ArtifactWriter -> open_artifact round trips: values, sharing, views, features, resources."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.artifact import ArtifactError, ArtifactWriter, intersect_activations, open_artifact, write_artifact
from ninfer.artifact.build import add_fused, add_packed, add_uses
from ninfer.artifact.formats import get_format
from ninfer.models.qwen3_5.params import logical_parameters
from ninfer.testing.checkpoints import tiny_config
from ninfer.testing.weights import random_logical_tensors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_values_preserved_zero_copy(tmp_path, cfg, dtype):
    tensors = random_logical_tensors(cfg, dtype)
    p = write_artifact(tmp_path / "m.ninfer", cfg, tensors.items(), metadata={"random_weights": True})
    with open_artifact(p, ("text", "mtp")) as a:
        assert a.config == cfg
        assert a.metadata == {"name": cfg.architecture, "random_weights": True}
        for name, t in tensors.items():
            got = a.tensor(name)
            assert got.dtype == t.dtype and torch.equal(got, t), name
        # Two reads of one binding alias the same mapped bytes: tensors are views, not copies.
        n = "layers.0.linear_attn.in_proj_qkv.weight"
        assert a.tensor(n).data_ptr() == a.tensor(n).data_ptr()
        assert a.tensor("layers.0.linear_attn.A_log").dtype == torch.float32


def test_fp32_kind_is_stored_fp32(tmp_path, cfg):
    tensors = random_logical_tensors(cfg, torch.bfloat16)
    tensors["layers.0.linear_attn.A_log"] = tensors["layers.0.linear_attn.A_log"].to(torch.bfloat16)
    p = write_artifact(tmp_path / "m.ninfer", cfg, tensors.items())
    with open_artifact(p) as a:
        got = a.tensor("layers.0.linear_attn.A_log")
        assert got.dtype == torch.float32
        assert torch.equal(got, tensors["layers.0.linear_attn.A_log"].float())


def test_tied_embedding_is_one_object_two_bindings(tmp_path):
    cfg = tiny_config(tie=True)
    tensors = random_logical_tensors(cfg)
    tensors.pop("lm_head.weight")
    p = write_artifact(tmp_path / "m.ninfer", cfg, tensors.items())
    with open_artifact(p, ("text", "mtp")) as a:
        assert a.bindings["lm_head.weight"].object == a.bindings["embed_tokens.weight"].object
        assert "lm_head.weight" not in a.objects
        assert torch.equal(a.tensor("lm_head.weight"), tensors["embed_tokens.weight"])
        sites = {u.site for u in a.uses_of("lm_head.weight")} | {u.site for u in a.uses_of("embed_tokens.weight")}
        assert sites == {"lm_head", "mtp.lm_head", "embed_tokens", "mtp.embed_tokens"}


def test_feature_selection(tmp_path, cfg):
    text_only = random_logical_tensors(cfg, features=("text",))
    p = write_artifact(tmp_path / "t.ninfer", cfg, text_only.items())
    with open_artifact(p) as a:
        assert a.available_features == ("text",)
    with pytest.raises(ArtifactError, match="feature 'mtp': not available"):
        open_artifact(p, ("text", "mtp"))
    with pytest.raises(ArtifactError, match="text is required"):
        open_artifact(p, ("mtp",))
    mm = tiny_config(multimodal=True)
    full = random_logical_tensors(mm, features=("text", "mtp", "vision"))
    p2 = write_artifact(tmp_path / "f.ninfer", mm, full.items())
    with open_artifact(p2, ("text",)) as a:
        assert not any(n.startswith(("mtp.", "visual.")) for n in a.bindings)
        assert all(u.feature == "text" for u in a.uses)
        with pytest.raises(ArtifactError, match="not bound for the selected features"):
            a.tensor("mtp.fc.weight")
        # Only objects actually read are checksummed.
        a.tensor("norm.weight")
        assert a._verified == {"norm.weight"}
    with open_artifact(p2, ("text", "mtp", "vision")) as a:
        assert torch.equal(a.tensor("visual.patch_embed.proj.weight"), full["visual.patch_embed.proj.weight"])
        assert a.bindings["visual.patch_embed.proj.weight"].feature == "vision"
    with pytest.raises(ArtifactError, match="visual.merger.linear_fc2.bias"):  # a tower is all or nothing
        write_artifact(tmp_path / "g.ninfer", mm, [(k, v) for k, v in full.items() if k != "visual.merger.linear_fc2.bias"])
    with pytest.raises(ArtifactError, match="unexpected tensor 'visual.pos_embed.weight'"):  # no vision geometry
        write_artifact(tmp_path / "h.ninfer", cfg, [*random_logical_tensors(cfg).items(),
                                                    ("visual.pos_embed.weight", full["visual.pos_embed.weight"])])


def test_write_artifact_reports_every_problem(tmp_path, cfg):
    tensors = random_logical_tensors(cfg)
    tensors.pop("norm.weight")
    tensors.pop("mtp.fc.weight")
    tensors["layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    tensors["bogus.weight"] = torch.zeros(1)
    with pytest.raises(ArtifactError) as e:
        write_artifact(tmp_path / "m.ninfer", cfg, tensors.items())
    msg = str(e.value)
    for needle in ("'norm.weight'", "'mtp.fc.weight'", "'layers.0.mlp.up_proj.weight' has shape [3, 3]", "'bogus.weight'"):
        assert needle in msg
    assert list(tmp_path.iterdir()) == []


def test_resources_round_trip(tmp_path, cfg):
    res = {"tokenizer.json": '{"x": 1}', "chat_template.jinja": "{{ messages }}", "blob.bin": bytes(range(256))}
    p = write_artifact(tmp_path / "m.ninfer", cfg, random_logical_tensors(cfg).items(), res)
    with open_artifact(p) as a:
        assert a.resource("tokenizer.json") == b'{"x": 1}'
        assert a.resource("blob.bin") == bytes(range(256))
        assert a.resources["chat_template.jinja"].media_type == "text/x-jinja2"
        with pytest.raises(ArtifactError, match="resource 'nope'"):
            a.resource("nope")


def _write_fused(path, cfg, tensors):
    """q_proj + k_proj of the attention layer in one int4 parent (two row views), v_proj fp8 with block scales,
    one dense MLP gate as NVFP4; everything else dense."""
    specs = logical_parameters(cfg)
    att = f"layers.{cfg.attention_layers[0]}.self_attn"
    fused = {f"{att}.q_proj.weight", f"{att}.k_proj.weight", f"{att}.v_proj.weight",
             "layers.0.mlp.gate_proj.weight"}
    with ArtifactWriter(path) as w:
        for n, t in tensors.items():
            if n not in fused:
                w.add_tensor(n, t)
                w.bind(n, n, feature=specs[n].feature, kind=specs[n].kind)
        add_fused(w, f"{att}.qk", [(f"{att}.q_proj.weight", tensors[f"{att}.q_proj.weight"]),
                                   (f"{att}.k_proj.weight", tensors[f"{att}.k_proj.weight"])],
                  feature="text", kind="linear", format="int_group", dtype="int4", params={"group_size": 32})
        add_packed(w, f"{att}.v_proj.weight", tensors[f"{att}.v_proj.weight"], format="fp8_e4m3",
                   dtype="float8_e4m3fn", params={"block": [32, 32]})
        w.bind(f"{att}.v_proj.weight", f"{att}.v_proj.weight", feature="text", kind="linear")
        add_packed(w, "layers.0.mlp.gate_proj.weight", tensors["layers.0.mlp.gate_proj.weight"], format="nvfp4",
                   dtype="nvfp4")
        w.bind("layers.0.mlp.gate_proj.weight", "layers.0.mlp.gate_proj.weight", feature="text", kind="linear")
        add_uses(w, activation=lambda site, b: "AllowA4" if b in fused else "A16Only")
        return w.finish(cfg.to_dict(), {"name": "fused"}, {})


def test_fused_parent_views_and_quantized_objects(tmp_path, cfg):
    tensors = random_logical_tensors(cfg, torch.float32)
    p = _write_fused(tmp_path / "q.ninfer", cfg, tensors)
    att = f"layers.{cfg.attention_layers[0]}.self_attn"
    q, k = tensors[f"{att}.q_proj.weight"], tensors[f"{att}.k_proj.weight"]
    with open_artifact(p) as a:
        bq, bk = a.bindings[f"{att}.q_proj.weight"], a.bindings[f"{att}.k_proj.weight"]
        assert bq.object == bk.object == f"{att}.qk"
        assert bq.rows == (0, q.shape[0]) and bk.rows == (q.shape[0], q.shape[0] + k.shape[0])
        parent = a.objects[bq.object]
        expect = get_format("int_group").unpack(
            get_format("int_group").pack(torch.cat([q, k]).numpy(), "int4", {"group_size": 32}),
            parent.shape, "int4", {"group_size": 32})
        np.testing.assert_array_equal(a.dequantize(bq.name).numpy(), expect[: q.shape[0]])
        np.testing.assert_array_equal(a.dequantize(bk.name).numpy(), expect[q.shape[0]:])
        assert a.planes(bk.name)["data"].shape == (k.shape[0], k.shape[1] // 2)
        for name, tol in ((f"{att}.v_proj.weight", 0.05), ("layers.0.mlp.gate_proj.weight", 0.2)):
            ref = tensors[name]
            err = (a.dequantize(name) - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
            assert err < tol, name
        with pytest.raises(ArtifactError, match="not dense"):
            a.tensor(bq.name)
        assert {u.activation for u in a.uses_of(bq.name)} == {"AllowA4"}


def test_view_must_align_to_block_scales(tmp_path, cfg):
    with ArtifactWriter(tmp_path / "v.ninfer") as w:
        add_packed(w, "p", torch.randn(64, 64), format="fp8_e4m3", dtype="float8_e4m3fn", params={"block": [32, 32]})
        w.bind("x", "p", feature="text", kind="linear", rows=(16, 64))
        with pytest.raises(ArtifactError, match="binding 'x': view rows not aligned to a plane"):
            w.finish(cfg.to_dict(), {}, {})
    assert list(tmp_path.iterdir()) == []


def test_activation_intersection():
    assert intersect_activations(["AllowA4", "AllowA8"]) == "AllowA8"
    assert intersect_activations(["AllowA4", "A16Only", "AllowA8"]) == "A16Only"
    assert intersect_activations(["AllowA4"]) == "AllowA4"


def test_tensors_outlive_close(tmp_path, cfg):
    tensors = random_logical_tensors(cfg)
    p = write_artifact(tmp_path / "m.ninfer", cfg, tensors.items())
    a = open_artifact(p)
    t = a.tensor("embed_tokens.weight")
    a.close()
    assert torch.equal(t, tensors["embed_tokens.weight"])
