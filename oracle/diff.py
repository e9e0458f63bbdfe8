"""Differential check of the fast model against the reference model on one ``.ninfer`` artifact.

The same random prompts go through the reference model (fp32, CPU) and the fast model (``dtype`` on ``device``,
``kernels``), all prompts decoded together as one batch on the fast side. Per request:

- logits relative RMS error at every step (the prompt's last position, then each decode step), the worst reported;
- teacher-forced top-1 agreement: the fast model is fed the reference's greedy tokens, so both see the same
  inputs at every step; the fraction of steps whose argmax agrees;
- greedy agreement length: the number of leading greedy tokens that agree. Free greedy runs of both models agree
  exactly up to the first step whose argmax differs (before it their inputs are identical), so this is the index
  of the first teacher-forced disagreement, and needs no second fast run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .metrics import rel_rms

MIN_TOP1 = 0.99
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_PAGE_SIZE = 16
_BUDGET = 1 << 40  # nominal: the KV pool is capped at exactly the pages the prompts need


def default_tolerance(dtype: torch.dtype, device: str, kernels: str) -> float:
    """1e-2 in bf16, 1e-4 in fp32; fp32 Triton on CUDA runs its ``tl.dot`` as TF32, hence 1e-2 there too."""
    if dtype == torch.bfloat16 or (device == "cuda" and kernels.startswith("triton")):
        return 1e-2
    return 1e-4


def default_kernels(dtype: torch.dtype, device: str) -> str:
    """Triton, except bf16 on CPU: the Triton interpreter's bf16 dots are wrong, so the naive ops run there."""
    return "naive" if device == "cpu" and dtype == torch.bfloat16 else "triton"


@dataclass(frozen=True)
class DiffRow:
    request: int
    steps: int
    rel_rms: float  # worst step
    worst_step: int  # 0 = the prompt's last position, k = decode step k
    agree: int  # teacher-forced steps whose argmax agrees
    greedy_len: int


@dataclass(frozen=True)
class DiffReport:
    artifact: str
    setup: str
    rows: tuple[DiffRow, ...]
    tolerance: float
    min_top1: float

    @property
    def worst_rel_rms(self) -> float:
        return max(r.rel_rms for r in self.rows)

    @property
    def top1(self) -> float:
        return sum(r.agree for r in self.rows) / sum(r.steps for r in self.rows)

    @property
    def min_greedy(self) -> int:
        return min(r.greedy_len for r in self.rows)

    @property
    def failures(self) -> list[str]:
        out = []
        if not self.worst_rel_rms <= self.tolerance:
            worst = max(self.rows, key=lambda r: r.rel_rms)
            out.append(f"worst logits relative RMS {self.worst_rel_rms:.3e} (request {worst.request}, step "
                       f"{worst.worst_step}) exceeds {self.tolerance:.1e}")
        if not self.top1 >= self.min_top1:
            out.append(f"teacher-forced top-1 agreement {self.top1:.4f} is below {self.min_top1}")
        return out

    def table(self) -> str:
        lines = [f"{'request':>7}{'steps':>7}{'rel RMS':>12}{'at step':>9}{'top-1':>8}{'greedy':>8}"]
        lines += [f"{r.request:>7}{r.steps:>7}{r.rel_rms:>12.3e}{r.worst_step:>9}{r.agree / r.steps:>8.3f}"
                  f"{r.greedy_len:>8}" for r in self.rows]
        return "\n".join(lines)


def build_fast(cfg, source: Callable[[str], torch.Tensor], *, requests: int, max_context: int,
               dtype: torch.dtype, device: str, kernels: str):
    """A FastModel with one block-table row, GDN slot and run of pages per request (row/slot ``i`` = request i)."""
    from ninfer.fast.memory import kv_pages_for_tokens, plan_memory
    from ninfer.fast.model import FastModel

    if device == "cpu" and kernels.startswith("triton"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
    per = kv_pages_for_tokens(max_context, _PAGE_SIZE)
    plan = plan_memory(cfg, _BUDGET, max_seqs=requests, max_context=max_context, page_size=_PAGE_SIZE,
                       dtype=dtype, max_kv_pages=requests * per)
    fast = FastModel.build(cfg, source, plan, device, kernels)
    for r in range(requests):
        fast.pools.block_tables[r] = torch.arange(r * per, (r + 1) * per, dtype=torch.int32, device=device)
    return fast


def _reference_run(ref, prompts: torch.Tensor, decode_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference logits [B, S, V] (S = 1 + decode_steps) and its greedy tokens [B, S]."""
    logits = []
    for prompt in prompts:
        state = ref.new_state()
        rows = [ref.prefill(prompt, state)[-1]]
        for _ in range(decode_steps):
            rows.append(ref.decode_step(int(rows[-1].argmax()), state))
        logits.append(torch.stack(rows))
    out = torch.stack(logits)
    return out, out.argmax(-1)


def _fast_run(fast, prompts: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """Fast logits [B, S, V] fp32 (CPU): each prompt prefilled, then batched decode steps fed ``forced`` [B, S]."""
    dev = fast.device
    B, T = prompts.shape
    rows = [fast.prefill(prompts[b].to(dev), b, b, 0) for b in range(B)]
    steps = [torch.stack(rows)]
    ids = torch.arange(B, dtype=torch.int32, device=dev)
    for s in range(forced.shape[1] - 1):
        pos = torch.full((B,), T + s, dtype=torch.int32, device=dev)
        steps.append(fast.decode(forced[:, s].to(dev), ids, ids, pos + 1, pos))
    return torch.stack(steps, dim=1).float().cpu()


def _row(b: int, ref: torch.Tensor, ours: torch.Tensor, forced: torch.Tensor) -> DiffRow:
    errs = [rel_rms(ours[s], ref[s]) for s in range(ref.shape[0])]
    match = (ours.argmax(-1) == forced).tolist()
    greedy = match.index(False) if False in match else len(match)
    worst = max(range(len(errs)), key=errs.__getitem__)
    return DiffRow(b, len(errs), errs[worst], worst, sum(match), greedy)


def run_diff(artifact_path: str | Path, *, prompts: int = 2, prompt_len: int = 32, decode_steps: int = 8,
             seed: int = 0, device: str = "cpu", kernels: str | None = None, dtype: torch.dtype = torch.bfloat16,
             tolerance: float | None = None, min_top1: float = MIN_TOP1) -> DiffReport:
    """Run ``prompts`` random prompts of ``prompt_len`` tokens plus ``decode_steps`` greedy steps through both
    models; ``kernels`` and ``tolerance`` default per :func:`default_kernels` and :func:`default_tolerance`."""
    from ninfer.artifact import open_artifact
    from ninfer.models.qwen3_5.params import TEXT
    from ninfer.reference.weights import load_model

    if prompts < 1 or prompt_len < 1 or decode_steps < 0:
        raise ValueError("run_diff needs prompts >= 1, prompt_len >= 1, decode_steps >= 0")
    kernels = kernels or default_kernels(dtype, device)
    tolerance = default_tolerance(dtype, device, kernels) if tolerance is None else tolerance
    ref = load_model(artifact_path, features=(TEXT,), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, ref.cfg.vocab_size, (prompts, prompt_len), generator=gen)
    with open_artifact(artifact_path, features=(TEXT,)) as art:
        fast = build_fast(art.config, art.dequantize, requests=prompts, max_context=prompt_len + decode_steps + 1,
                          dtype=dtype, device=device, kernels=kernels)
    with torch.no_grad():
        ref_logits, forced = _reference_run(ref, tokens, decode_steps)
        ours = _fast_run(fast, tokens, forced)
    rows = tuple(_row(b, ref_logits[b], ours[b], forced[b]) for b in range(prompts))
    setup = f"fast {str(dtype).removeprefix('torch.')} on {device}, {kernels} kernels vs reference fp32 on cpu"
    return DiffReport(str(artifact_path), setup, rows, tolerance, min_top1)


def main_diff(artifact_path: str | Path, *, echo: Callable[[str], None] = print, **kw) -> int:
    """Run :func:`run_diff` (same keywords), print the table and the summary; 0 when within thresholds, else 1."""
    report = run_diff(artifact_path, **kw)
    echo(f"artifact: {report.artifact}")
    echo(f"{report.setup}; rel RMS tolerance {report.tolerance:.1e}, top-1 >= {report.min_top1}")
    echo(report.table())
    for failure in report.failures:
        echo(f"FAIL: {failure}")
    echo(f"worst logits relative RMS: {report.worst_rel_rms:.3e}")
    echo(f"teacher-forced top-1 agreement: {report.top1:.4f}")
    echo(f"min greedy agreement length: {report.min_greedy}")
    return 1 if report.failures else 0
