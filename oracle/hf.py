"""Parity of the reference model with HF transformers on one checkpoint directory (fp32 on both sides).

Cases per random prompt, every position compared:
- ``prefill``: HF full-sequence forward vs the reference's chunked prefill;
- ``prefill-step``: the same against the reference's prefill through the GDN step recurrence;
- ``decode``: HF with its cache fed one token at a time vs the reference's ``decode_step`` after a prefill.

The reference's weights come through the product path by default (``via="artifact"``: the converter writes a
``.ninfer`` file, the artifact reader reads it back), or straight from the safetensors files (``via="checkpoint"``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ninfer.models.qwen3_5.params import MTP, TEXT
from ninfer.reference.model import ReferenceModel
from ninfer.reference.weights import checkpoint_summary, hf_config, load_weights, weights_from_hf_dir

from .metrics import max_abs, rel_rms

TOLERANCE = 1e-5
VIAS = ("artifact", "checkpoint")


@dataclass(frozen=True)
class ParityRow:
    case: str
    prompt: int
    positions: int
    rel_rms: float
    max_abs: float


@dataclass(frozen=True)
class ParityReport:
    checkpoint: str
    weights_source: str
    rows: tuple[ParityRow, ...]
    tolerance: float

    @property
    def worst(self) -> float:
        return max(r.rel_rms for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def table(self) -> str:
        lines = [f"{'case':<14}{'prompt':>7}{'positions':>11}{'rel RMS':>14}{'max abs':>14}"]
        lines += [f"{r.case:<14}{r.prompt:>7}{r.positions:>11}{r.rel_rms:>14.3e}{r.max_abs:>14.3e}" for r in self.rows]
        return "\n".join(lines)


def load_hf(checkpoint_dir: str | Path):
    """The transformers CausalLM of the directory in fp32 (multimodal configs load as the text CausalLM)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=torch.float32).eval()


def reference_weights(checkpoint_dir: str | Path, via: str = "artifact") -> tuple[dict[str, torch.Tensor], str]:
    """fp32 logical weights of the checkpoint (MTP included when the config has it) and a line saying how."""
    cfg = hf_config(checkpoint_dir)
    features = (TEXT, MTP) if cfg.mtp_num_hidden_layers > 0 else (TEXT,)
    if via == "checkpoint":
        return weights_from_hf_dir(checkpoint_dir, features), "checkpoint safetensors (converter bypassed)"
    if via != "artifact":
        raise ValueError(f"via must be one of {VIAS}, got {via!r}")
    from ninfer.convert.convert import convert_checkpoint

    with tempfile.TemporaryDirectory(prefix="ninfer-oracle-") as tmp:
        path = convert_checkpoint(checkpoint_dir, Path(tmp) / "oracle.ninfer", progress=False)
        return load_weights(path, features), "convert_checkpoint -> .ninfer artifact reader"


def _hf_decode(hf, prompt: torch.Tensor, cont: torch.Tensor) -> torch.Tensor:
    """HF logits [n, V] for each token of ``cont`` fed one at a time after caching ``prompt``."""
    out = hf(input_ids=prompt[None], use_cache=True)
    cache, rows = out.cache, []
    for tok in cont:
        out = hf(input_ids=tok.reshape(1, 1), cache=cache, use_cache=True)
        cache = out.cache
        rows.append(out.logits[0, -1])
    return torch.stack(rows)


def _row(case: str, prompt: int, ours: torch.Tensor, theirs: torch.Tensor) -> ParityRow:
    return ParityRow(case, prompt, ours.shape[0], rel_rms(ours, theirs), max_abs(ours, theirs))


def _prompt_rows(hf, ref: ReferenceModel, p: int, prompt: torch.Tensor, cont: torch.Tensor) -> list[ParityRow]:
    hf_logits = hf(input_ids=prompt[None]).logits[0]  # [T, V]
    rows = [_row("prefill", p, ref.prefill(prompt, ref.new_state(), chunked=True), hf_logits),
            _row("prefill-step", p, ref.prefill(prompt, ref.new_state(), chunked=False), hf_logits)]
    if cont.numel():
        state = ref.new_state()
        ref.prefill(prompt, state)
        ours = torch.stack([ref.decode_step(tok, state) for tok in cont])
        rows.append(_row("decode", p, ours, _hf_decode(hf, prompt, cont)))
    return rows


def run_hf_parity(checkpoint_dir: str | Path, *, num_prompts: int = 2, prompt_len: int = 150,
                  decode_steps: int = 8, seed: int = 0, tolerance: float = TOLERANCE,
                  via: str = "artifact") -> ParityReport:
    """Compare reference and HF logits on ``num_prompts`` random prompts of ``prompt_len`` tokens, each followed
    by ``decode_steps`` random tokens decoded one at a time. ``via`` picks the weight path (see the module doc).
    """
    if num_prompts < 1 or prompt_len < 1 or decode_steps < 0:
        raise ValueError("run_hf_parity needs num_prompts >= 1, prompt_len >= 1, decode_steps >= 0")
    cfg = hf_config(checkpoint_dir)
    weights, source = reference_weights(checkpoint_dir, via)
    ref = ReferenceModel(cfg, weights, dtype=torch.float32)
    hf = load_hf(checkpoint_dir)
    gen = torch.Generator().manual_seed(seed)
    rows: list[ParityRow] = []
    with torch.no_grad():
        for p in range(num_prompts):
            tokens = torch.randint(0, cfg.vocab_size, (prompt_len + decode_steps,), generator=gen)
            rows += _prompt_rows(hf, ref, p, tokens[:prompt_len], tokens[prompt_len:])
    return ParityReport(checkpoint_summary(checkpoint_dir), source, tuple(rows), tolerance)


def main_hf(checkpoint_dir: str | Path, *, num_prompts: int = 2, prompt_len: int = 150, decode_steps: int = 8,
            seed: int = 0, tolerance: float = TOLERANCE, via: str = "artifact",
            echo: Callable[[str], None] = print) -> int:
    """Run the parity check, print the table; exit code 0 when every case is within ``tolerance``, else 1."""
    report = run_hf_parity(checkpoint_dir, num_prompts=num_prompts, prompt_len=prompt_len,
                           decode_steps=decode_steps, seed=seed, tolerance=tolerance, via=via)
    echo(f"checkpoint: {report.checkpoint}")
    echo(f"reference weights from: {report.weights_source}; tolerance {tolerance:.1e}")
    echo(report.table())
    if not report.ok:
        echo(f"FAIL: worst relative RMS error exceeds {tolerance:.1e}")
    echo(f"worst relative RMS error: {report.worst:.3e}")
    return 0 if report.ok else 1
