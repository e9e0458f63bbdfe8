"""The DFlash / DFlash2 backend of the reference Program (docs/speculative.md, "DFlash and DFlash2").

Its state per slot is the drafter's context KV (`ninfer.reference.dflash.DrafterContext`): every consumption of
tokens (prefill chunk, decode step, verify, replay, forced control) appends the context of those positions from
the target's tapped layer outputs, so the context is a function of the consumed tokens like the GDN and KV state,
and a backup, a checkpoint, a host replica and a replay carry it. Drafting is one non-causal drafter pass over
[pending, MASK x k] at the frontier, read-only: the block's K/V never persist. DFlash takes slot j's draft from its
own logits; DFlash2 walks the candidate selector from the pending token, each slot's scores depending on the token
taken before it. Both draw with `draw_draft`, so greedy rows take the argmax and sampled rows carry q.

The drafter is a text-only stack with 1-D RoPE: over a prompt with images it rotates at MRoPE's temporal row
(`PromptMedia.drafter_positions`), and its blocks after the prompt at position + rope_delta (docs/speculative.md,
"Images").
"""

from __future__ import annotations

from typing import Sequence

import torch

from ninfer.contracts.media import PromptMedia
from ninfer.models.qwen3_5.drafter import DrafterKind
from ninfer.program_core import ActiveSequence
from ninfer.reference.dflash import Drafter, DrafterContext
from ninfer.reference.dflash_selector import CandidateSelector
from ninfer.sampling import RowContext, SamplingError, draft_vocabulary, draw_draft


class DFlashBackend:
    wants_taps = True

    def __init__(self, drafter: Drafter, block_size: int, window: int | None, draft_vocab: int | None = None):
        """block_size: the drafter pass's length (num_speculative_tokens + 1); window: the context positions kept
        (None: every committed position); draft_vocab: drafts from the token ids below it alone (None: all)."""
        self.drafter, self.block_size, self.window, self.draft_vocab = drafter, block_size, window, draft_vocab
        self.layers = drafter.cfg.target_layer_ids

    def empty(self) -> DrafterContext:
        return self.drafter.empty_context()

    def advance(self, ctx: DrafterContext, tokens: Sequence[int], start: int, hidden: torch.Tensor,
                taps: dict[int, torch.Tensor], media: PromptMedia | None = None, embeds=None) -> None:
        positions = None if media is None else torch.from_numpy(media.drafter_positions(start, start + len(tokens)))
        self.drafter.extend(ctx, torch.cat([taps[i] for i in self.layers], dim=-1), start, self.window, positions)

    def draft(self, ctx: DrafterContext, seq: ActiveSequence, rctx: RowContext, k: int
              ) -> tuple[tuple[int, ...], list[torch.Tensor | None]]:
        assert ctx.end == seq.frontier, f"drafter context ends at {ctx.end}, the frontier is {seq.frontier}"
        delta = 0 if seq.media is None else seq.media.rope_delta
        logits, hidden = self.drafter.block(ctx, seq.pending, self.block_size, delta)  # [B-1, V], [B-1, H]
        logits = draft_vocabulary(logits, self.draft_vocab)
        selector = None
        if self.drafter.cfg.kind is DrafterKind.DFLASH2:
            selector = CandidateSelector(self.drafter.root.sub("candidate_selector"), self.drafter.cfg.selector_top_k,
                                         logits, hidden)
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        previous = seq.pending
        for j in range(k):
            z = logits[j] if selector is None else selector.scores(j, previous)
            try:
                previous, q = draw_draft(z, rctx, seq.frontier + 1 + j, drafts)
            except SamplingError:
                break  # a draft distribution that cannot be drawn from ends the drafts, not the request
            drafts.append(previous)
            qs.append(q)
        return tuple(drafts), qs
