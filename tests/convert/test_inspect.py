"""inspect_artifact's report and verify_artifact's error."""

from __future__ import annotations

import pytest

from ninfer.artifact import ArtifactError, open_artifact, write_artifact
from ninfer.convert.convert import convert_checkpoint
from ninfer.convert.inspect import inspect_artifact, verify_artifact


def test_report_of_converted_checkpoint(tmp_path, checkpoints):
    out = convert_checkpoint(checkpoints["moe_fused_multimodal_bf16"], tmp_path / "m.ninfer", progress=False)
    report = inspect_artifact(out, verify=True)
    for needle in ("architecture      Qwen3_5MoeForCausalLM", "4 (3 linear attention, 1 full attention), MTP layers 1",
                   "moe               4 experts, top-2", "features          mtp, text, vision",
                   "checksums         all", "tokenizer.json", "chat_template.jinja", "text     experts",
                   "vision   vision", "layers.0.mlp.experts.gate_up_proj", "uses by activation: A16Only",
                   "vision            depth 2, hidden 32, 2 heads x 16, mlp 48 (gelu_pytorch_tanh), patch 16 temporal 2, "
                   "merge 2x2 -> 64, pos grid 6x6", "vision tokens     image 263, video 264, start 261, end 262",
                   "preprocessor_config.json", "checkpoint:preprocessor_config.json",
                   "visual.blocks.1.attn.qkv.weight"):
        assert needle in report, needle
    assert "RANDOM" not in report


def test_report_flags_random_weights_and_sharing(tmp_path, checkpoints):
    from ninfer.convert.hf_source import logical_name
    from ninfer.testing.checkpoints import read_checkpoint_tensors

    src = checkpoints["dense_multimodal_tied"]
    with open_artifact(convert_checkpoint(src, tmp_path / "c.ninfer", progress=False)) as a:
        cfg = a.config
    tensors = ((logical_name(k), v) for k, v in read_checkpoint_tensors(src).items())
    p = write_artifact(tmp_path / "r.ninfer", cfg, tensors, metadata={"random_weights": True})
    report = inspect_artifact(p)
    assert "NOTE: this artifact holds RANDOM weights" in report
    assert "embed_tokens.weight <- embed_tokens.weight, lm_head.weight" in report


def test_checkpoint_without_vision_weights_converts_text_only_with_geometry_kept(tmp_path, checkpoints):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(checkpoints["dense_multimodal_tied"], src)
    for f in src.glob("*.safetensors"):
        save_file({k: v for k, v in load_file(str(f)).items() if not k.startswith("model.visual.")}, str(f))
    (src / "preprocessor_config.json").unlink()
    out = convert_checkpoint(src, tmp_path / "t.ninfer", progress=False)
    with open_artifact(out) as a:
        assert a.available_features == ("mtp", "text") and a.config.vision is not None
        assert "preprocessor_config.json" not in a.resources
    with pytest.raises(ArtifactError, match="feature 'vision': not available"):
        open_artifact(out, ("text", "vision"))
    # A tower without its processor constants gets the released ones.
    shutil.copy(checkpoints["dense_multimodal_tied"] / "model.safetensors", src / "model.safetensors")
    with open_artifact(convert_checkpoint(src, tmp_path / "v.ninfer", progress=False)) as a:
        pre = json.loads(a.resource("preprocessor_config.json"))
        assert pre["size"] == {"shortest_edge": 65536, "longest_edge": 16777216} and pre["patch_size"] == 16


def test_verify_names_broken_object(tmp_path, checkpoints):
    out = convert_checkpoint(checkpoints["dense"], tmp_path / "m.ninfer", progress=False)
    assert verify_artifact(out) > 0
    with open_artifact(out) as a:
        o = a.objects["layers.2.linear_attn.in_proj_qkv.weight"]
    data = bytearray(out.read_bytes())
    data[o.offset + 3] ^= 1
    out.write_bytes(bytes(data))
    inspect_artifact(out)  # without verify, a report still comes out
    with pytest.raises(ArtifactError, match="object 'layers.2.linear_attn.in_proj_qkv.weight': checksum mismatch"):
        inspect_artifact(out, verify=True)
    with pytest.raises(ArtifactError, match="layers.2.linear_attn.in_proj_qkv.weight"):
        verify_artifact(out)


def test_inspect_verify_of_a_100k_deep_descriptor_is_a_clear_error(tmp_path, checkpoints):
    """Was an uncaught RecursionError; now the CLI's one artifact error line naming the descriptor."""
    from click.testing import CliRunner

    from ninfer.artifact.header import HEADER_SIZE, Header
    from ninfer.cli import main

    out = convert_checkpoint(checkpoints["dense"], tmp_path / "m.ninfer", progress=False)
    data = bytearray(out.read_bytes())
    h = Header.unpack(bytes(data[:HEADER_SIZE]), len(data))
    raw = b'{"format": "ninfer", "version": 3, "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    import zlib
    new = Header(h.data_offset, h.descriptor_offset, len(raw), zlib.crc32(raw), h.descriptor_offset + len(raw))
    out.write_bytes(new.pack() + bytes(data[HEADER_SIZE:h.descriptor_offset]) + raw)
    result = CliRunner().invoke(main, ["inspect", str(out), "--verify"])
    assert result.exit_code != 0
    assert "descriptor: nested too deeply" in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, RecursionError)
