"""`ninfer convert TARGET OUT --drafter DIR`: a published-layout DFlash / DFlash2 drafter stored beside the target as
its own bindings (values preserved, config as the `drafter/config.json` resource, listed by inspect), and drafters
that do not fit the target refused at conversion naming the field, with no output written."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from ninfer.artifact import open_artifact
from ninfer.artifact.errors import ArtifactError
from ninfer.cli import main
from ninfer.convert.convert import convert_checkpoint
from ninfer.convert.errors import ConversionError
from ninfer.convert.hf_source import HFSource
from ninfer.convert.inspect import inspect_artifact
from ninfer.models.qwen3_5.drafter import DrafterConfig, DrafterKind, drafter_parameters
from ninfer.testing.drafters import make_drafter_checkpoint


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from ninfer.testing.checkpoints import make_hf_checkpoint
    return make_hf_checkpoint(tmp_path_factory.mktemp("target") / "t", mtp=False)


def _target_cfg(target):
    src = HFSource(target)
    src.close()
    return src.config


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_round_trip_keeps_every_drafter_value(tmp_path, target, kind):
    cfg = _target_cfg(target)
    draft = make_drafter_checkpoint(tmp_path / "d", cfg, kind, seed=3, dtype=torch.float32)
    out = convert_checkpoint(target, tmp_path / "m.ninfer", progress=False, drafter=draft)
    from safetensors.torch import load_file
    published = load_file(str(draft / "model.safetensors"))
    with open_artifact(out, features=("text", kind)) as art:
        d = art.drafter
        assert d.kind is DrafterKind(kind) and d.vocab_size == cfg.vocab_size and d.block_size == 16
        assert set(drafter_parameters(d)) == {n for n, b in art.bindings.items() if b.feature == kind}
        assert len(published) == len(drafter_parameters(d))
        for key, t in published.items():
            assert torch.equal(art.tensor("dflash." + key), t), key
    with open_artifact(out) as art:  # text only: the drafter is not loaded
        assert art.drafter is None and not any(n.startswith("dflash.") for n in art.bindings)
    report = inspect_artifact(out)
    assert f"features          {kind}, text" in report and f"drafter           {kind}: 2 layers at hidden 64" in report
    assert ("selector rank 8 over top-8" in report) == (kind == "dflash2")


def test_cli_convert_takes_a_drafter(tmp_path, target):
    draft = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash2", block_size=8)
    out = tmp_path / "m.ninfer"
    r = CliRunner().invoke(main, ["convert", str(target), str(out), "--drafter", str(draft), "--no-progress"])
    assert r.exit_code == 0, r.output
    with open_artifact(out, features=("text", "dflash2")) as art:
        assert art.drafter.block_size == 8 and art.drafter.conv_groups == 8


@pytest.mark.parametrize("config, field", [
    (dict(hidden_size=32), "hidden_size"),
    (dict(vocab_size=500), "vocab_size"),
    (dict(num_target_layers=6), "num_target_layers"),
    (dict(target_layer_ids=[1, 4]), "dflash_config.target_layer_ids"),
    (dict(mask_token_id=512), "dflash_config.mask_token_id"),
    (dict(is_causal=True), "is_causal"),
])
def test_a_drafter_that_does_not_fit_is_refused_naming_the_field(tmp_path, target, config, field):
    draft = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash", **config)
    out = tmp_path / "o" / "m.ninfer"
    with pytest.raises(ConversionError) as e:
        convert_checkpoint(target, out, progress=False, drafter=draft)
    assert f"config field {field!r}" in str(e.value)
    assert not out.exists()


def test_drafter_tensor_problems_are_reported_together(tmp_path, target):
    cfg = _target_cfg(target)
    draft = make_drafter_checkpoint(tmp_path / "d", cfg, "dflash2", drop=("layers.1.mlp_conv.base_kernel",),
                                    extra_tensors={"embed_tokens.weight": torch.zeros(512, 64),
                                                   "layers.0.extra": torch.zeros(2),
                                                   "fc.weight": torch.zeros(64, 64)})
    with pytest.raises(ConversionError) as e:
        convert_checkpoint(target, tmp_path / "m.ninfer", progress=False, drafter=draft)
    msg = str(e.value)
    for needle in ("the drafter uses the target's embed_tokens.weight", "missing drafter tensor "
                   "'layers.1.mlp_conv.base_kernel'", "unexpected drafter tensor 'layers.0.extra'",
                   "'fc.weight' has shape [64, 64], expected [64, 128]"):
        assert needle in msg, needle
    assert len(e.value.problems) == 4


def test_a_dflash2_config_without_its_modules_sizes_is_refused(tmp_path, target):
    raw_dir = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash2")
    raw = json.loads((raw_dir / "config.json").read_text())
    del raw["dflash_config"]["selector_top_k"]
    with pytest.raises(Exception) as e:
        DrafterConfig.from_hf(raw)
    assert e.value.field == "dflash_config.selector_top_k"


def test_a_damaged_drafter_resource_names_the_field(tmp_path, target):
    """The reader checks the stored drafter config against the target, as the converter did."""
    from ninfer.artifact.writer import ArtifactWriter
    draft = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash")
    out = convert_checkpoint(target, tmp_path / "m.ninfer", progress=False, drafter=draft)
    with open_artifact(out, features=None) as art:
        desc, cfg = art.descriptor, art.drafter
        tensors = {n: art.tensor(n) for n in art.bindings}
        resources = {r.name: art.resource(r.name) for r in desc.resources}
    resources["drafter/config.json"] = json.dumps({**cfg.to_dict(), "hidden_size": 32}).encode()
    bad = tmp_path / "bad.ninfer"
    with ArtifactWriter(bad, progress=False) as w:
        for b in desc.bindings:
            if b.object == b.name:
                t = tensors[b.name]
                w.add_object(b.name, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape),
                             planes={"data": [t.contiguous()]})
        for b in desc.bindings:
            w.bind(b.name, b.object, feature=b.feature, kind=b.kind)
        for name, data in resources.items():
            w.add_resource(name, data)
        w.finish(desc.config, desc.metadata, desc.provenance)
    with pytest.raises(ArtifactError, match="hidden_size"):
        open_artifact(bad, features=("text", "dflash"))


def test_a_converted_drafter_serves_on_the_reference_program(tmp_path, target):
    """The artifact path end to end: from_artifact loads the drafter over the target's embedding and lm_head, greedy
    equals the plain run; an artifact without one (or with the other kind) is a start-up error naming the method."""
    from ninfer.program_core.speculative import MissingBackendWeights, SpeculativeConfig, SpeculativeMethod
    from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
    from ninfer.testing.serving import serve
    from ninfer.testing.sessions import token_request

    draft = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash", block_size=8, dtype=torch.float32)
    out = convert_checkpoint(target, tmp_path / "m.ninfer", progress=False, drafter=draft)
    bare = convert_checkpoint(target, tmp_path / "bare.ninfer", progress=False)

    def program(path, spec):
        return ReferenceProgram.from_artifact(path, ReferenceProgramConfig(max_concurrency=1, max_context=64,
                                                                           speculative=spec))
    spec = program(out, SpeculativeConfig(SpeculativeMethod.DFLASH, 7))
    assert spec.drafter.cfg.block_size == 8 and spec.drafter.lm_head is spec.model.weights["lm_head.weight"]
    got = serve(spec, [token_request((5, 6, 7), 6)], max_concurrency=1)
    assert got[0].token_ids == serve(program(out, None), [token_request((5, 6, 7), 6)], max_concurrency=1)[0].token_ids
    assert got[0].usage.draft_tokens > 0
    for path, method in ((bare, "dflash"), (out, "dflash2")):
        with pytest.raises(MissingBackendWeights) as e:
            program(path, SpeculativeConfig(SpeculativeMethod(method), 7))
        assert e.value.field == "method" and f"a {method} drafter" in str(e.value)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"rope_theta": "fast"})])
def test_a_malformed_drafter_config_is_a_conversion_error(tmp_path, target, text):
    draft = make_drafter_checkpoint(tmp_path / "d", _target_cfg(target), "dflash")
    if text.startswith("{\""):
        text = json.dumps({**json.loads((draft / "config.json").read_text()), **json.loads(text)})
    (draft / "config.json").write_text(text)
    out = tmp_path / "o" / "m.ninfer"
    with pytest.raises(ConversionError) as e:
        convert_checkpoint(target, out, progress=False, drafter=draft)
    assert "config.json" in str(e.value) and str(draft) in str(e.value)  # names the drafter's directory
    assert not out.exists()
