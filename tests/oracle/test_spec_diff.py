"""``oracle.spec_diff``: two Programs with the MTP backend on one tiny fp32 artifact, behind the Engine.

Reference against reference agrees exactly (forced drafts, so every acceptance length and the rollback run); a
perturbed side fails on the logits, and a side that drafts differently fails on acceptance although its greedy
tokens are equal (speculation is lossless, so tokens alone would not show it). The fast Program (naive kernels)
against the reference agrees within the fp32 tolerance, with forced drafts and with the MTP head's own, and with a
DFlash2 drafter converted beside the target."""

from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

from ninfer.artifact import write_artifact
from ninfer.cli import main
from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.testing.weights import peaked_text_tensors
from ninfer.testing.speculation import ForcedDrafts
from oracle.diff import default_tolerance
from oracle.spec_diff import main_spec_diff, run_spec_diff

SPEC = {"method": "mtp", "num_speculative_tokens": 3}
RUN = dict(prompts=2, prompt_len=9, decode_steps=10, dtype=torch.float32, device="cpu", kernels="naive")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    cfg = Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=97, hidden_size=32, num_hidden_layers=3,
        layer_types=[LINEAR, FULL, LINEAR], num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, intermediate_size=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, mtp_num_hidden_layers=1, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}))
    tensors = peaked_text_tensors(cfg, features=("text", "mtp"))
    return write_artifact(tmp_path_factory.mktemp("spec_diff") / "tiny.ninfer", cfg, tensors.items())


def _reference(artifact, change=None):
    def make(spec, lanes, max_context):
        program = ReferenceProgram.from_artifact(artifact, ReferenceProgramConfig(
            max_concurrency=lanes, max_context=max_context, speculative=spec))
        if change is not None:
            change(program)
        return program
    return make


def test_reference_against_reference_agrees(artifact):
    lines: list[str] = []
    assert main_spec_diff(artifact, SPEC, echo=lines.append, forced=True, make_other=_reference(artifact),
                          **RUN) == 0, "\n".join(lines)
    report = run_spec_diff(artifact, SPEC, forced=True, make_other=_reference(artifact), **RUN)
    assert not report.failures and report.worst_rel_rms == 0.0 and report.unmatched == 0
    assert all(r.equal and r.lengths_equal and r.blocks > 1 for r in report.rows)
    assert sum(r.accepted for r in report.rows) > 0, "forced drafts accepted nothing: the diff saw no real block"
    assert lines[-3] == "accepted tokens equal: 2 of 2 requests" and "request" in lines[2]


def test_scaled_verify_logits_fail_the_diff(artifact):
    def scale(program):
        verify = program.executor.verify
        program.executor.verify = lambda seqs, feds: [lg * 1.01 for lg in verify(seqs, feds)]

    report = run_spec_diff(artifact, SPEC, forced=True, make_other=_reference(artifact, scale), **RUN)
    assert any("relative RMS" in f for f in report.failures), report.failures


def test_other_drafts_fail_on_acceptance_not_on_greedy_tokens(artifact):
    """One side keeps the MTP head's drafts, the other is forced: lossless, so the greedy tokens agree, but the
    rounds do not, and the blocks it drafted differently are not compared."""
    def force(program):
        ForcedDrafts(program.model).install(program)

    report = run_spec_diff(artifact, SPEC, make_other=_reference(artifact, force), **RUN)
    greedy = report.rows[0]
    assert greedy.mode == "greedy" and greedy.equal and not greedy.lengths_equal
    assert any("rounds by emitted length differ" in f for f in report.failures) and report.unmatched > 0


# With NINFER_TEST_DEVICE=cuda the fast side also runs on the GPU with the Triton kernels (fp32 tl.dot is TF32 there)
DEVICES = [("cpu", "naive")] + ([("cuda", "triton")] if os.environ.get("NINFER_TEST_DEVICE") == "cuda"
                                 and torch.cuda.is_available() else [])


@pytest.mark.parametrize("device, kernels", DEVICES)
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "mtp"])
def test_fast_against_reference(artifact, forced, device, kernels):
    tolerance = default_tolerance(torch.float32, device, kernels)
    report = run_spec_diff(artifact, SPEC, forced=forced, tolerance=tolerance,
                           **{**RUN, "device": device, "kernels": kernels})
    assert not report.failures, report.failures
    assert report.setup.startswith(f"fast float32 on {device}, {kernels} kernels")
    assert all(r.equal and r.lengths_equal and r.blocks > 1 for r in report.rows)
    assert 0 < report.worst_rel_rms < report.tolerance


def test_cli_speculative_config(artifact):
    runner = CliRunner()
    bad = runner.invoke(main, ["oracle", "diff", "--model", str(artifact), "--speculative-config",
                               '{"method":"mtp","num_speculative_tokens":9}'])
    assert bad.exit_code != 0 and "num_speculative_tokens" in bad.output
    got = runner.invoke(main, ["oracle", "diff", "--model", str(artifact), "--speculative-config",
                               '{"method":"mtp","num_speculative_tokens":2}', "--forced-drafts", "--dtype",
                               "float32", "--device", "cpu", "--kernels", "naive", "--prompt-len", "7",
                               "--decode-steps", "6"])
    assert got.exit_code == 0 and "accepted tokens equal: 2 of 2 requests" in got.output, got.output


@pytest.fixture(scope="module")
def drafter_artifact(artifact, tmp_path_factory):
    from ninfer.testing.drafters import with_drafter
    return with_drafter(artifact, tmp_path_factory.mktemp("spec_diff_dflash") / "d.ninfer", "dflash2", block_size=8)


@pytest.mark.parametrize("device, kernels", DEVICES)
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "dflash2"])
def test_fast_against_reference_with_dflash2(drafter_artifact, forced, device, kernels):
    """The same diff with a DFlash2 drafter converted beside the target: both Programs load it from the artifact,
    and every verified block and accepted length agrees (the drafter's own drafts and forced ones)."""
    tolerance = default_tolerance(torch.float32, device, kernels)
    report = run_spec_diff(drafter_artifact, {"method": "dflash2", "num_speculative_tokens": 7}, forced=forced,
                           tolerance=tolerance, **{**RUN, "device": device, "kernels": kernels})
    assert not report.failures, report.failures
    assert all(r.equal and r.lengths_equal and r.blocks > 1 for r in report.rows)
    assert 0 < report.worst_rel_rms < report.tolerance
    if device == "cpu":  # fp32 on both sides: the drafter's own drafts are the same block for block
        assert report.unmatched == 0
    if forced:
        assert sum(r.accepted for r in report.rows) > 5


@pytest.fixture(scope="module")
def image_artifacts(tmp_path_factory):
    from ninfer.testing.image_prompts import multimodal_artifacts
    return multimodal_artifacts(tmp_path_factory.mktemp("spec_diff_images"))


@pytest.mark.parametrize("device, kernels", DEVICES)
@pytest.mark.parametrize("method, k, forced", [("mtp", 3, True), ("mtp", 3, False), ("dflash", 7, False),
                                               ("dflash2", 7, True)])
def test_fast_against_reference_on_image_prompts(image_artifacts, method, k, forced, device, kernels):
    """Two images in every prompt (docs/speculative.md, "Images"): every verified block (rotated at position +
    rope_delta), accepted length and, with their own drafts, every block's drafts agree."""
    pytest.importorskip("PIL.Image")
    tolerance = default_tolerance(torch.float32, device, kernels)
    report = run_spec_diff(image_artifacts[method], {"method": method, "num_speculative_tokens": k}, forced=forced,
                           tolerance=tolerance, images=2, **{**RUN, "device": device, "kernels": kernels})
    assert not report.failures, report.failures
    assert report.setup.endswith("2 images a prompt")
    assert all(r.equal and r.lengths_equal and r.blocks > 1 for r in report.rows)
    assert 0 < report.worst_rel_rms < report.tolerance
    if device == "cpu":
        assert report.unmatched == 0


def test_cli_images(image_artifacts):
    runner = CliRunner()
    got = runner.invoke(main, ["oracle", "diff", "--model", str(image_artifacts["mtp"]), "--speculative-config",
                               '{"method":"mtp","num_speculative_tokens":2}', "--images", "1", "--dtype", "float32",
                               "--device", "cpu", "--kernels", "naive", "--prompt-len", "7", "--decode-steps", "6"])
    assert got.exit_code == 0 and "1 image a prompt" in got.output, got.output
    bad = runner.invoke(main, ["oracle", "diff", "--model", str(image_artifacts["mtp"]), "--images", "1"])
    assert bad.exit_code != 0 and "--images" in bad.output
