"""``oracle.diff``: the fast model against the reference on a tiny fp32 artifact agrees to rounding; a perturbed
fast model fails the check and the report names the number that failed. Triton runs through the interpreter on CPU
(tests/conftest.py sets TRITON_INTERPRET), so only one test pays for it; the others run the naive kernels."""

from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

import oracle.diff as diff
from ninfer.artifact import write_artifact
from ninfer.cli import main
from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.testing.weights import peaked_text_tensors

RUN = dict(prompts=2, prompt_len=9, decode_steps=3, dtype=torch.float32, device="cpu")
# With NINFER_TEST_DEVICE=cuda the Triton variant runs on the GPU (no interpreter there), with its TF32 tolerance.
TRITON_DEVICE = "cuda" if os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available() else "cpu"


def _tiny_config() -> Qwen35Config:
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=97, hidden_size=32, num_hidden_layers=3,
        layer_types=[LINEAR, FULL, LINEAR], num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, intermediate_size=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, mtp_num_hidden_layers=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}))


_tiny_weights = peaked_text_tensors  # fp32 weights with peaked logits (ninfer.testing.checkpoints)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    cfg = _tiny_config()
    return write_artifact(tmp_path_factory.mktemp("oracle_diff") / "tiny.ninfer", cfg, _tiny_weights(cfg).items())


def _perturbed(monkeypatch, change):
    """Make every fast model built by oracle.diff go through ``change(fast)`` first."""
    build = diff.build_fast

    def build_and_change(*args, **kw):
        fast = build(*args, **kw)
        change(fast)
        return fast
    monkeypatch.setattr(diff, "build_fast", build_and_change)


@pytest.mark.parametrize("kernels", ["triton", "naive"])
def test_fp32_fast_model_matches_reference(artifact, kernels):
    device = TRITON_DEVICE if kernels == "triton" else "cpu"
    report = diff.run_diff(artifact, kernels=kernels, **{**RUN, "device": device})
    assert report.tolerance == diff.default_tolerance(torch.float32, device, kernels) and len(report.rows) == 2
    assert report.worst_rel_rms < report.tolerance
    assert report.top1 == 1.0
    assert report.min_greedy == RUN["decode_steps"] + 1
    assert not report.failures


def test_main_diff_prints_the_summary_and_returns_0(artifact):
    lines: list[str] = []
    assert diff.main_diff(artifact, kernels="naive", echo=lines.append, **RUN) == 0
    assert lines[-3].startswith("worst logits relative RMS: ")
    assert lines[-2] == "teacher-forced top-1 agreement: 1.0000"
    assert lines[-1] == "min greedy agreement length: 4"
    assert not any(line.startswith("FAIL") for line in lines)


def test_scaled_lm_head_fails_on_relative_rms(artifact, monkeypatch):
    # scaling every logit by 1.05 keeps the argmax: only the error threshold trips
    _perturbed(monkeypatch, lambda fast: fast.weights.lm_head.mul_(1.05))
    lines: list[str] = []
    assert diff.main_diff(artifact, kernels="naive", echo=lines.append, **RUN) == 1
    fails = [line for line in lines if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL: worst logits relative RMS 5.0")
    assert "exceeds 1.0e-04" in fails[0]
    assert "teacher-forced top-1 agreement: 1.0000" in lines


def test_biased_lm_head_row_fails_on_top1(artifact, monkeypatch):
    # a large logit bias on token 5 on the fast side: the argmax disagrees wherever 5 is not the reference's pick
    def bias(fast):
        unbiased = fast.logits
        fast.logits = lambda hidden: unbiased(hidden) + 100.0 * (torch.arange(97) == 5)
    _perturbed(monkeypatch, bias)
    report = diff.run_diff(artifact, kernels="naive", **RUN)
    assert report.top1 < 0.99 and report.min_greedy < RUN["decode_steps"] + 1
    assert any(f.startswith("teacher-forced top-1 agreement") for f in report.failures)


def test_cli_oracle_diff(artifact):
    args = ["oracle", "diff", "--model", str(artifact), "--prompts", "1", "--prompt-len", "6", "--decode-steps",
            "2", "--dtype", "float32", "--device", "cpu", "--kernels", "naive"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "naive kernels" in result.output
    assert "min greedy agreement length: 3" in result.output
    bad = CliRunner().invoke(main, args + ["--tolerance", "1e-12"])
    assert bad.exit_code == 1 and "FAIL: worst logits relative RMS" in bad.output
