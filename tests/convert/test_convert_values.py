"""convert_checkpoint preserves every tensor, fuses per-expert keys, ties lm_head, and splits features."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact import open_artifact
from ninfer.convert.convert import convert_checkpoint
from ninfer.testing.checkpoints import VARIANTS, load_hf_model, read_checkpoint_tensors

PER_EXPERT = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def _expected(key: str) -> str:
    """Independent statement of the key mapping, in the test's own words."""
    for prefix, repl in (("model.language_model.", ""), ("model.visual.", "visual."), ("model.", "")):
        if key.startswith(prefix):
            return repl + key[len(prefix):]
    return key


def _source_value(art, name: str) -> torch.Tensor:
    """The artifact value that a checkpoint tensor of this logical name must equal (per-expert keys: a slice)."""
    parts = name.split(".")
    if "experts" in parts and parts[-1] == "weight" and parts[-2] in ("gate_proj", "up_proj", "down_proj"):
        base, e, proj = ".".join(parts[:-3]), int(parts[-3]), parts[-2]
        if proj == "down_proj":
            return art.tensor(f"{base}.down_proj")[e]
        gate_up = art.tensor(f"{base}.gate_up_proj")[e]
        half = gate_up.shape[0] // 2
        return gate_up[:half] if proj == "gate_proj" else gate_up[half:]
    return art.tensor(name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_tensor_preserved(tmp_path, checkpoints, variant):
    src = checkpoints[variant]
    kw = VARIANTS[variant]
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    ck = read_checkpoint_tensors(src)
    with open_artifact(out, features=None) as art:
        want = {"text", "vision"} if kw.get("multimodal") else {"text"}
        want |= {"mtp"} if kw.get("mtp", True) else set()
        assert set(art.available_features) == want
        for key, value in ck.items():
            name = _expected(key)
            got = _source_value(art, name)
            if name.endswith(("A_log", "dt_bias")):
                assert got.dtype == torch.float32
                assert torch.equal(got, value.float()), key
            else:
                assert got.dtype == value.dtype and torch.equal(got, value), key
        if kw.get("tie"):
            assert art.bindings["lm_head.weight"].object == "embed_tokens.weight"
            assert "lm_head.weight" not in art.objects
        assert art.config.tie_word_embeddings == bool(kw.get("tie"))
        assert art.verify() > 0


@pytest.mark.parametrize("variant", ["dense_multimodal_tied", "moe_per_expert_sharded"])
def test_matches_transformers_state_dict(tmp_path, checkpoints, variant):
    """What transformers loads from the checkpoint is exactly what the artifact binds."""
    src = checkpoints[variant]
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    model = load_hf_model(src)
    with open_artifact(out) as art:
        sd = model.state_dict()
        assert {k.removeprefix("model.") for k in sd} == set(art.bindings)
        for k, v in sd.items():
            assert torch.equal(art.tensor(k.removeprefix("model.")), v), k


def test_dtype_cast_keeps_fp32_kinds(tmp_path, checkpoints):
    src = checkpoints["dense"]
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False, dtype=torch.bfloat16)
    ck = read_checkpoint_tensors(src)
    with open_artifact(out, ("text", "mtp")) as art:
        for key, value in ck.items():
            got = art.tensor(_expected(key))
            if key.endswith(("A_log", "dt_bias")):
                assert got.dtype == torch.float32 and torch.equal(got, value)
            else:
                assert got.dtype == torch.bfloat16 and torch.equal(got, value.to(torch.bfloat16)), key
        assert art.provenance["recipe"] == {"name": "preserve", "dtype": "bfloat16"}


def test_uses_and_metadata(tmp_path, checkpoints):
    out = convert_checkpoint(checkpoints["moe_per_expert_sharded"], tmp_path / "m.ninfer", progress=False,
                             name="tiny-moe")
    with open_artifact(out, ("text", "mtp")) as art:
        assert art.metadata["name"] == "tiny-moe"
        sites = {u.site: u for u in art.uses}
        assert sites["layers.0.mlp.experts.gate_up_proj"].binding == "layers.0.mlp.experts.gate_up_proj"
        assert sites["mtp.embed_tokens"].binding == "embed_tokens.weight"
        assert sites["layers.3.self_attn.q_proj"].activation == "A16Only"
        files = {f["name"]: f for f in art.provenance["source"]["files"]}
        assert "model.safetensors.index.json" in files and "model-00001-of-00003.safetensors" in files
        assert all("sha256" in f or "header_sha256" in f for f in files.values())


@pytest.mark.parametrize("dtype", [None, "float16"])
def test_small_chunks_stream_and_cast(tmp_path, checkpoints, monkeypatch, dtype):
    """Tensors span many read chunks (and per-expert parts); copying and casting chunk by chunk loses nothing."""
    from ninfer.convert import hf_source

    monkeypatch.setattr(hf_source, "CHUNK", 96)
    src = checkpoints["moe_per_expert_sharded"]
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False, dtype=dtype)
    with open_artifact(out, ("text", "mtp")) as art:
        for key, value in read_checkpoint_tensors(src).items():
            got = _source_value(art, _expected(key))
            want = value if dtype is None or key.endswith(("A_log", "dt_bias")) else value.to(torch.float16)
            assert torch.equal(got, want), key
