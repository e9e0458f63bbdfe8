"""`ninfer oracle hf` and `ninfer oracle diff`: differential checks of the reference and fast models."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ninfer.serve.cli_command import needs_extra
from ninfer.serve.cli_options import show_progress

from .group import existing_dir, main


@main.group()
def oracle() -> None:
    """Differential checks: HF transformers vs the reference Program."""


@oracle.command("hf")
@click.option("--checkpoint", required=True, type=click.Path(path_type=Path),
              help="A local HF checkpoint directory (converted on the fly).")
@click.option("--prompts", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--prompt-len", default=80, show_default=True, type=click.IntRange(1, 100000))
@click.option("--decode-steps", default=8, show_default=True, type=click.IntRange(0, 100000))
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=1e-5, show_default=True)
def oracle_hf(checkpoint: Path, prompts: int, prompt_len: int, decode_steps: int, seed: int, tolerance: float) -> None:
    """Compare the reference model's logits with transformers' on CHECKPOINT; exit 1 over tolerance."""
    with needs_extra("test"):
        import transformers  # noqa: F401 - the oracle's other side

    from oracle.hf import main_hf

    sys.exit(main_hf(existing_dir(checkpoint, "checkpoint"), num_prompts=prompts, prompt_len=prompt_len,
                     decode_steps=decode_steps, seed=seed, tolerance=tolerance))


@oracle.command("diff")
@click.option("--model", default=None, help="A .ninfer artifact or an HF checkpoint dir (default: the embedded "
                                             "default model).")
@click.option("--prompts", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--prompt-len", default=32, show_default=True, type=click.IntRange(1, 100000))
@click.option("--decode-steps", default=8, show_default=True, type=click.IntRange(0, 100000))
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: cuda when available.")
@click.option("--kernels", type=click.Choice(["auto", "triton", "triton-fused", "naive"]), default="auto",
              show_default=True, help="auto: triton, except naive for bf16 on CPU; triton-fused adds the decode "
                                      "GEMVs with the norm in their prologue and the residual add in their epilogue.")
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=None, type=float,
              help="Max logits relative RMS [default: 1e-2 bf16 or fp32 Triton on CUDA (TF32), else 1e-4].")
@click.option("--speculative-config", default=None,
              help='JSON, e.g. \'{"method":"mtp","num_speculative_tokens":3}\': compare the fast and reference '
                   "Programs with this backend through the Engine (accepted tokens, acceptance, block logits).")
@click.option("--forced-drafts", is_flag=True,
              help="With --speculative-config: drafts that force every acceptance length (ForcedDrafts).")
@click.option("--images", default=0, show_default=True, type=click.IntRange(0, 8),
              help="With --speculative-config: random images in every prompt (a model with a vision tower).")
def oracle_diff(model: str | None, prompts: int, prompt_len: int, decode_steps: int, dtype: str, device: str,
                kernels: str, seed: int, tolerance: float | None, speculative_config: str | None,
                forced_drafts: bool, images: int) -> None:
    """Compare the fast model's logits with the reference model's on MODEL; exit 1 over the thresholds."""
    import torch

    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeConfigError
    from ninfer.runtime_options import WiringError, parse_json_option
    from ninfer.wiring import resolve_model_path
    from oracle.diff import DTYPES, default_kernels, default_tolerance, main_diff

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    raw = parse_json_option(speculative_config, "--speculative-config")
    try:
        SpeculativeConfig.parse(raw)
    except SpeculativeConfigError as e:
        raise WiringError(str(e)) from None
    path = resolve_model_path(model, progress=show_progress(False), report=lambda line: click.echo(line, err=True))
    kw = dict(prompts=prompts, prompt_len=prompt_len, decode_steps=decode_steps, seed=seed, device=device,
              dtype=DTYPES[dtype])
    if raw is None:
        if images:
            raise WiringError("--images: the image prompts are compared with --speculative-config only")
        sys.exit(main_diff(path, kernels=None if kernels == "auto" else kernels, tolerance=tolerance, **kw))
    from oracle.spec_diff import main_spec_diff

    kernels = default_kernels(DTYPES[dtype], device) if kernels == "auto" else kernels
    tolerance = default_tolerance(DTYPES[dtype], device, kernels) if tolerance is None else tolerance
    sys.exit(main_spec_diff(path, raw, kernels=kernels, tolerance=tolerance, forced=forced_drafts, images=images,
                            **kw))
