"""Image prompts for Program tests with a speculative backend, on both Programs: the tiny multimodal checkpoint
converted (transformers' tiny tower, MTP weights) with an optional random drafter, its `VisionPrompt`, requests with
odd-sized images, and `ScratchDrafts`, which checks every draft a Program makes against the same drafts computed
from scratch over the committed tokens with the positions docs/speculative.md ("Images") fixes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ninfer.program_core import ActiveSequence
from ninfer.reference.dflash import Drafter
from ninfer.reference.model import ReferenceModel
from ninfer.reference.vision import VisionTower
from ninfer.sampling import RowContext, SamplingError, draw_draft

from .checkpoints import TINY_PREPROCESSOR, VISION_TOKEN_IDS, make_hf_checkpoint
from .sessions import token_request

START, END, PAD = (VISION_TOKEN_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id"))


def multimodal_artifacts(root: Path) -> dict[str, Path]:
    """The tiny multimodal checkpoint (with MTP weights large enough that its attention depends on positions)
    converted, and copies with a random DFlash and DFlash2 drafter: {"mtp": ..., "dflash": ..., "dflash2": ...}."""
    from ninfer.convert.convert import convert_checkpoint
    from ninfer.testing.drafters import with_drafter

    ckpt = make_hf_checkpoint(root / "ck", multimodal=True, seed=9, mtp_std=0.2)
    base = convert_checkpoint(ckpt, root / "m.ninfer", progress=False)
    return {"mtp": base, **{kind: with_drafter(base, root / f"{kind}.ninfer", kind, block_size=8)
                            for kind in ("dflash", "dflash2")}}


def vision_prompt(artifact: Path):
    from ninfer.artifact import open_artifact
    from ninfer.frontend.image_processor import ImageProcessorConfig
    from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt

    with open_artifact(artifact) as a:
        v = a.config.vision
    return VisionPrompt(v, ImageProcessorConfig.from_json(json.dumps(TINY_PREPROCESSOR), v), VisionLimits(4))


def image_request(vp, seeds: Sequence[int], tail: Sequence[int], max_tokens: int = 8,
                  sizes=((90, 150), (70, 40)), **kw):
    """A prompt with one random image per seed (odd sizes), text between and after them."""
    from PIL import Image

    from ninfer.frontend.image_processor import process_image

    images = [process_image(vp.processor, Image.fromarray(np.random.RandomState(s).randint(0, 256, (h, w, 3),
                                                                                            dtype=np.uint8)))
              for s, (h, w) in zip(seeds, sizes)]
    text = [1, 2, 3]
    for i in range(len(images)):
        text += [START, PAD, END, 20 + i]
    ids, _, media = vp.expand(text + list(tail), [], images)
    return token_request(ids, max_tokens, media=media, **kw)



def assert_prefix_hit_on_an_image_equals_the_cold_run(make: Callable[[], Any], vp, where: str,
                                                      cold: Callable[[], Any] | None = None,
                                                      q_tol: float | None = None) -> None:
    """A sampled request resumed from a checkpoint after its image (`where` "after", past <|vision_end|>) or among
    its pads ("inside": the resumed prefill encodes the image again and the backend takes the rest of its rows)
    equals the cold run of `make()`'s Program (of `cold()`'s when given: one stage against `make`'s pipeline
    stages): the drafts depend on the backend state at the checkpoint. The resumed request's drafts (and with
    `q_tol` their q) are compared with the cold run's, not only its tokens: zeroed MTP keys at the checkpoint left
    the tokens and the drafts equal, only q moved (`spec_driving.assert_resumed_drafts_equal`)."""
    from ninfer.sampling import SamplingParams
    from ninfer.testing.serving import assert_drained, in_turns, serve
    from ninfer.testing.spec_driving import assert_resumed_drafts_equal, record_blocks

    sampled = dict(sampling=SamplingParams(temperature=0.9), seed=5)
    first = image_request(vp, (4,), [7, 8, 9], 4, sizes=((90, 150),), **sampled)
    img = first.media.images[0]
    after = img.end + 1 if where == "after" else img.offset + 5
    first = token_request(first.prompt, 4, media=first.media, capture_hints=(after,), **sampled)
    again = lambda: image_request(vp, (4,), [10, 11, 12], 10, sizes=((90, 150),), **sampled)  # noqa: E731
    program = make()
    blocks = record_blocks(program)
    _, (hit,) = in_turns(program, [[first], [again()]], max_concurrency=1, prefill_chunk=48)
    assert hit.usage.cached_prompt_tokens == after
    cold_program = (cold or make)()
    cold_blocks = record_blocks(cold_program)
    (want,) = serve(cold_program, [again()], max_concurrency=1, prefix_caching=False)
    assert hit.token_ids == want.token_ids
    if cold_program.limits.speculative is not None:  # the second request ran alone: the tail of `blocks`
        assert_resumed_drafts_equal(blocks, cold_blocks, q_tol)
    assert_drained(program, published=True)

class ScratchDrafts:
    """A wrapper of `program.executor.draft` that recomputes every row's drafts from scratch: the target over the
    committed tokens in one pass (image features at the placeholders, MRoPE positions), then the MTP head over
    every pair (h_p, x_{p+1}) at p's MRoPE position with x_{p+1} embedded as the target embedded it, and its chained
    drafts at F - 1 + j; or the DFlash drafter's context over every position at MRoPE's temporal row and its block
    at F + rope_delta onwards. Drafts must be equal and each sampled row's q close (`tol` relative)."""

    def __init__(self, model: ReferenceModel, vision: VisionTower, drafter: Drafter | None = None,
                 block_size: int = 0, tol: float = 1e-4):
        self.model, self.vision, self.drafter, self.block_size, self.tol = model, vision, drafter, block_size, tol
        self.checked = 0  # drafts compared

    def install(self, program: Any) -> Any:
        self.inner, program.executor.draft = program.executor.draft, self
        return program

    def __call__(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]):
        out = self.inner(seqs, ctxs, ks)  # the host's [(drafts, q)] or the fast MTP's DraftBlock (its host view)
        for seq, ctx, k, (drafts, qs) in zip(seqs, ctxs, ks, out):
            if not k:
                continue
            want, want_q = self._scratch(seq, ctx, k)
            assert tuple(drafts) == tuple(want), (seq.frontier, drafts, want)
            for q, w in zip(qs, want_q):
                if w is not None:
                    # relative: q of a random model is near uniform, so its entries are ~1/V
                    torch.testing.assert_close(q.double().cpu(), w.double(), rtol=self.tol, atol=self.tol / w.numel())
            self.checked += len(want)
        return out

    def _target(self, seq: ActiveSequence):
        """The target's final-normed hidden [F, H] and every layer's output over the committed tokens, the model
        ids and the image rows (rows [n], features [n, H])."""
        media, tokens = seq.media, list(seq.tokens)
        ids = media.model_ids(tokens)
        rows = torch.cat([torch.arange(i.offset, i.end) for i in media.images])
        feats = torch.cat([self.vision.encode(torch.from_numpy(i.pixels), i.grid) for i in media.images])
        taps: dict[int, torch.Tensor] = {}
        _, hidden = self.model.prefill(torch.tensor(ids), self.model.new_state(), chunked=False, return_hidden=True,
                                       taps=taps, positions=torch.from_numpy(media.positions_for(0, len(ids))),
                                       embeds=(rows, feats))
        return hidden, taps, ids, (rows, feats)

    def _scratch(self, seq: ActiveSequence, ctx: RowContext, k: int):
        hidden, taps, ids, (rows, feats) = self._target(seq)
        media, F = seq.media, len(ids)
        if self.drafter is None:
            logits_of = self._mtp(media, hidden, ids, rows, feats, seq.pending)
        else:
            logits_of = self._dflash(media, taps, F, seq.pending)
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        for j in range(k):
            try:
                x, q = draw_draft(logits_of(j, drafts), ctx, F + 1 + j, drafts)
            except SamplingError:
                break
            drafts.append(x)
            qs.append(q)
        return drafts, qs

    def _mtp(self, media, hidden, ids, rows, feats, pending):
        from ninfer.reference.state import SequenceState

        F = len(ids)
        state = SequenceState(gdn={}, kv={}, mtp_kv=self._mtp_cache())
        keep = rows >= 1  # x_{p+1} for p = 0..F-2 are ids[1:]: image rows shift down by one
        self.model.mtp_forward(hidden[:-1], torch.tensor(ids[1:]), state,
                               positions=torch.from_numpy(media.positions_for(0, F - 1)),
                               embeds=(rows[keep] - 1, feats[keep]))
        chain = {"h": hidden[-1]}

        def logits_of(j: int, drafts: list[int]) -> torch.Tensor:
            x = pending if j == 0 else drafts[-1]
            at = F - 1 + j
            logits, chain["h"] = self.model.mtp_forward(
                chain["h"][None], torch.tensor([x]), state, step=j, return_hidden=True,
                positions=torch.from_numpy(media.positions_for(at, at + 1)))
            chain["h"] = chain["h"][0]
            return logits[0]
        return logits_of

    def _mtp_cache(self):
        from ninfer.reference.state import KVCache

        cfg, dtype = self.model.cfg, self.model.dtype
        shape = (cfg.num_key_value_heads, 0, cfg.head_dim)
        return [KVCache(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                for _ in range(cfg.mtp_num_hidden_layers)]

    def _dflash(self, media, taps, F: int, pending: int):
        d = self.drafter
        ctx = d.empty_context()
        d.extend(ctx, torch.cat([taps[i] for i in d.cfg.target_layer_ids], dim=-1), 0, None,
                 torch.from_numpy(media.drafter_positions(0, F)))
        logits, _ = d.block(ctx, pending, self.block_size, media.rope_delta)  # [B-1, V]
        return lambda j, drafts: logits[j]
