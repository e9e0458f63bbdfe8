"""Differential check of two Programs with the same speculative backend on one ``.ninfer`` artifact: the fast
Program (``dtype`` on ``device``, ``kernels``) against the reference Program (fp32, CPU), both behind the Engine.

The same random prompts (every other one sampled with its own seed, the rest greedy) are served on each side with
the same Engine settings, so both schedule the same rounds. Each side's executor is watched: every prefill's logits
and every verified block's logits, keyed by (prompt, frontier, consumed tokens), so a block both sides drafted the
same way is compared logit for logit. Per request:

- accepted tokens: the leading output tokens both sides agree on, and whether all do;
- acceptance: the rounds by emitted length (``Usage.acceptance_lengths``) equal on both sides;
- blocks: verified blocks both sides ran with the same drafts, and the worst logits relative RMS over those blocks
  and the prefills.

``forced=True`` replaces both drafters by ``ForcedDrafts`` over the reference model (the same teacher on both
sides), so every acceptance length and the rollback of a partly accepted block are exercised even though random
weights make the MTP head's own drafts almost never right.

``images=N`` (an artifact with a vision tower) puts N random images of odd sizes after each prompt's first token,
through the Frontend's vision prompt (placeholders, MRoPE positions): both Programs serve them with the vision tower,
so verification at position + rope_delta and the backend's positions over the images (docs/speculative.md,
"Images") are compared too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .metrics import rel_rms

Key = tuple[tuple[int, ...], int, tuple[int, ...]]


class Watch:
    """Record a Program's prefill and verify logits (fp32, CPU) by (prompt, frontier, consumed tokens)."""

    def __init__(self, program: Any):
        self.logits: dict[Key, torch.Tensor] = {}
        ex = program.executor
        prefill, verify = ex.prefill, ex.verify

        def watched_prefill(seq, start, end, captures=()):
            out = prefill(seq, start, end, captures)
            self.logits[(tuple(seq.prompt), start, tuple(seq.prompt[start:end]))] = out.detach().float().cpu()[None]
            return out

        def watched_verify(seqs, feds):
            out = verify(seqs, feds)
            for s, fed, lg in zip(seqs, feds, out):
                # a copy: the fast Program's logits are views of its verify graphs' output, which the next pass
                # (a replay at commit) overwrites
                self.logits[(tuple(s.prompt), s.frontier, tuple(fed))] = lg.detach().float().cpu().clone()
            return out

        ex.prefill, ex.verify = watched_prefill, watched_verify


@dataclass(frozen=True)
class SpecRow:
    request: int
    mode: str  # "greedy" or "sampled"
    tokens: int  # reference output length
    agree: int  # leading output tokens equal on both sides
    equal: bool  # all output tokens equal
    lengths_equal: bool  # rounds by emitted length equal
    rounds: int  # reference rounds with drafts
    accepted: int  # reference accepted drafts
    blocks: int  # verified blocks (and prefills) both sides ran with the same tokens
    rel_rms: float  # worst over those


@dataclass(frozen=True)
class SpecDiffReport:
    artifact: str
    setup: str
    rows: tuple[SpecRow, ...]
    unmatched: int  # reference blocks the other side never ran (different drafts)
    tolerance: float

    @property
    def worst_rel_rms(self) -> float:
        return max(r.rel_rms for r in self.rows)

    @property
    def failures(self) -> list[str]:
        out = [f"request {r.request} ({r.mode}): accepted tokens differ from token {r.agree}"
               for r in self.rows if not r.equal]
        out += [f"request {r.request} ({r.mode}): rounds by emitted length differ" for r in self.rows
                if r.equal and not r.lengths_equal]
        if not self.worst_rel_rms <= self.tolerance:
            out.append(f"worst logits relative RMS {self.worst_rel_rms:.3e} exceeds {self.tolerance:.1e}")
        if not all(r.blocks for r in self.rows):
            out.append("a request has no block both sides ran: nothing was compared")
        return out

    def table(self) -> str:
        lines = [f"{'request':>7}{'mode':>8}{'tokens':>7}{'agree':>7}{'lengths':>8}{'rounds':>7}{'accepted':>9}"
                 f"{'blocks':>7}{'rel RMS':>12}"]
        lines += [f"{r.request:>7}{r.mode:>8}{r.tokens:>7}{r.agree:>7}{'same' if r.lengths_equal else 'DIFF':>8}"
                  f"{r.rounds:>7}{r.accepted:>9}{r.blocks:>7}{r.rel_rms:>12.3e}" for r in self.rows]
        return "\n".join(lines)


def _requests(prompts: list[tuple[int, ...]], media: list, max_tokens: int, seed: int) -> list:
    from ninfer.sampling import SamplingParams
    from ninfer.testing.sessions import token_request

    sampled = SamplingParams(temperature=0.8, top_p=0.95)
    return [token_request(p, max_tokens, sampling=sampled if i % 2 else None, seed=seed + i, media=m)
            for i, (p, m) in enumerate(zip(prompts, media))]


def _with_images(artifact_path: str | Path, tokens: torch.Tensor, images: int, seed: int
                 ) -> tuple[list[tuple[int, ...]], list, int]:
    """Each row of random `tokens` with `images` random images after its first token: (prompts with placeholder
    ids, their PromptMedia, the most patches of one image)."""
    import numpy as np
    from PIL import Image

    from ninfer.artifact import open_artifact
    from ninfer.frontend.image_processor import ImageProcessorConfig, process_image
    from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt

    with open_artifact(artifact_path) as art:
        v = art.config.vision
        if v is None:
            raise ValueError("images need an artifact with a vision tower")
        data = art.resource("preprocessor_config.json") if "preprocessor_config.json" in art.resources else None
    vp = VisionPrompt(v, ImageProcessorConfig.from_json(data, v), VisionLimits(images))
    marks = (v.vision_start_token_id, v.image_token_id, v.vision_end_token_id)
    rng = np.random.RandomState(seed)
    prompts, media, most = [], [], 0
    for row in tokens.tolist():
        text = [1 if t in marks or t == v.video_token_id else t for t in row]
        shots = [process_image(vp.processor, Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8)))
                 for h, w in rng.randint(40, 160, (images, 2))]
        ids, _, m = vp.expand(text[:1] + list(marks) * images + text[1:], [], shots)
        prompts.append(tuple(ids))
        media.append(m)
        most = max([most] + [int(np.prod(i.grid)) for i in m.images])
    return prompts, media, most


def _serve(program: Any, requests: list, lanes: int) -> tuple[list, Watch]:
    from ninfer.testing.serving import serve

    watch = Watch(program)
    return serve(program, requests, max_concurrency=lanes, prefill_chunk=16), watch


def _row(i: int, prompt: tuple[int, ...], ref, other, ref_watch: Watch, other_watch: Watch) -> SpecRow:
    a, b = ref.token_ids, other.token_ids
    agree = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    keys = [k for k in ref_watch.logits if k[0] == prompt and k in other_watch.logits]
    errs = [rel_rms(other_watch.logits[k], ref_watch.logits[k]) for k in keys]
    usage = ref.usage
    return SpecRow(i, "sampled" if i % 2 else "greedy", len(a), agree, a == b,
                   usage.acceptance_lengths == other.usage.acceptance_lengths, sum(usage.acceptance_lengths),
                   usage.accepted_draft_tokens, len(keys), max(errs, default=float("inf")))


def run_spec_diff(artifact_path: str | Path, speculative: dict, *, prompts: int = 2, prompt_len: int = 32,
                  decode_steps: int = 8, seed: int = 0, device: str = "cpu", kernels: str = "naive",
                  dtype: torch.dtype = torch.float32, tolerance: float = 1e-4, forced: bool = False,
                  images: int = 0, make_other: Callable[[Any, int, int], Any] | None = None) -> SpecDiffReport:
    """Serve the same requests on the reference Program and on `make_other(spec, lanes, max_context)` (default:
    the fast Program on `device` with `kernels` in `dtype`), both speculating as `speculative` says; `images`
    random images in every prompt (both Programs with the vision tower)."""
    from ninfer.artifact import open_artifact
    from ninfer.program_core.speculative import SpeculativeConfig
    from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig

    if not speculative:
        raise ValueError("run_spec_diff needs a speculative config")
    # round by round at the full block on both sides: the adaptive width follows costs measured on the device
    speculative = {**speculative, "adaptive": False}
    spec = SpeculativeConfig.parse(speculative)
    gen = torch.Generator().manual_seed(seed)
    with open_artifact(artifact_path) as art:
        vocab = art.config.vocab_size
    tokens = torch.randint(0, vocab, (prompts, prompt_len), generator=gen)
    texts, media, patches = [tuple(t) for t in tokens.tolist()], [None] * prompts, 0
    if images:
        texts, media, patches = _with_images(artifact_path, tokens, images, seed)
    lanes = prompts
    max_context = max(map(len, texts)) + decode_steps + spec.num_speculative_tokens + 1
    ref = ReferenceProgram.from_artifact(artifact_path, ReferenceProgramConfig(
        max_concurrency=lanes, max_context=max_context, speculative=spec), vision=bool(images))
    if make_other is None:
        from ninfer.fast.program import FastProgram

        other = FastProgram.from_artifact(artifact_path, max_concurrency=lanes, max_context=max_context,
                                          speculative_config=speculative, budget_bytes=1 << 40,
                                          kv_pages=2 * lanes * -(-max_context // 16), device=device,
                                          kernels=kernels, dtype=dtype, vision_patches=patches)
        setup = f"fast {str(dtype).removeprefix('torch.')} on {device}, {kernels} kernels"
    else:
        other, setup = make_other(spec, lanes, max_context), "the given Program"
    if forced:
        from ninfer.testing.speculation import ForcedDrafts

        ForcedDrafts(ref.model, ref.executor.vision).install(ref)
        ForcedDrafts(ref.model, ref.executor.vision).install(other)
    with torch.no_grad():
        ref_out, ref_watch = _serve(ref, _requests(texts, media, decode_steps, seed), lanes)
        other_out, other_watch = _serve(other, _requests(texts, media, decode_steps, seed), lanes)
    rows = tuple(_row(i, texts[i], r, o, ref_watch, other_watch) for i, (r, o) in enumerate(zip(ref_out, other_out)))
    unmatched = sum(k not in other_watch.logits for k in ref_watch.logits)
    setup += f" vs reference fp32 on cpu, {spec.name}{', forced drafts' if forced else ''}"
    setup += f", {images} image{'s' if images > 1 else ''} a prompt" if images else ""
    return SpecDiffReport(str(artifact_path), setup, rows, unmatched, tolerance)


def main_spec_diff(artifact_path: str | Path, speculative: dict, *, echo: Callable[[str], None] = print,
                   **kw) -> int:
    """Run :func:`run_spec_diff`, print the oracle-diff table and the summary; 0 when both sides agree, else 1."""
    report = run_spec_diff(artifact_path, speculative, **kw)
    echo(f"artifact: {report.artifact}")
    echo(f"{report.setup}; rel RMS tolerance {report.tolerance:.1e}")
    echo(report.table())
    for failure in report.failures:
        echo(f"FAIL: {failure}")
    same = sum(r.equal for r in report.rows)
    echo(f"accepted tokens equal: {same} of {len(report.rows)} requests")
    echo(f"blocks with different drafts: {report.unmatched}")
    echo(f"worst logits relative RMS: {report.worst_rel_rms:.3e}")
    return 1 if report.failures else 0
