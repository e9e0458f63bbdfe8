"""The MTP backend of the reference Program: the MTP head's state per slot, advanced with every consumed token,
and its k drafts per row (docs/speculative.md, "The MTP backend").

A backend is what the executor asks for state and drafts: `empty()` (the state before any token), `advance(state,
tokens, start, hidden, taps, media, embeds)` (the consumption of `tokens` (model ids) at start.. with the target's
final-normed hidden [T, H], when `wants_taps` every layer's output, and for a sequence with images its
`PromptMedia` and the image rows the target embedded), and `draft(state, seq, ctx, k)` (k drafts and their q from
the committed state, on a private copy).

With images (docs/speculative.md, "Images"): pair (h_p, x_{p+1}) rotates at p's MRoPE position (three rows; index
+ rope_delta after the prompt) and embeds x_{p+1} as the target did, an image token by its feature, which is what
vLLM feeds the published Qwen3.5 MTP head (the target's positions, image embeddings shifted by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ninfer.contracts.media import PromptMedia
from ninfer.program_core import ActiveSequence
from ninfer.reference.model import ReferenceModel
from ninfer.reference.state import KVCache, SequenceState
from ninfer.sampling import RowContext, SamplingError, draft_vocabulary, draw_draft


@dataclass
class MTPState:
    """The MTP backend's state at frontier t: each MTP layer's KV over the pairs (h_p, x_{p+1}) for p < t - 1,
    and the target's final-normed hidden h_{t-1} that the next pair (with the pending token) starts from."""

    kv: list[KVCache]
    hidden: torch.Tensor | None  # [H], None before any token

    def clone(self) -> "MTPState":
        return MTPState([c.clone() for c in self.kv], None if self.hidden is None else self.hidden.clone())


def _view(mtp: MTPState) -> SequenceState:
    """A SequenceState that holds only MTP KV (what ReferenceModel.mtp_forward reads and extends)."""
    return SequenceState(gdn={}, kv={}, mtp_kv=mtp.kv)


class MTPBackend:
    wants_taps = False

    def __init__(self, model: ReferenceModel, draft_vocab: int | None = None):
        """`draft_vocab`: drafts from the token ids below it alone (None: the whole vocabulary)."""
        self.model, self.draft_vocab = model, draft_vocab

    def empty(self) -> MTPState:
        cfg, dtype = self.model.cfg, self.model.dtype
        shape = (cfg.num_key_value_heads, 0, cfg.head_dim)
        return MTPState([KVCache(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                         for _ in range(cfg.mtp_num_hidden_layers)], None)

    def advance(self, mtp: MTPState, tokens: Sequence[int], start: int, hidden: torch.Tensor, taps: dict,
                media: PromptMedia | None = None, embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """The MTP pairs that consuming `tokens` at start.. completes: (h_p, x_{p+1}) for p = start-1 .. end-2
        (h_{start-1} is the stored hidden; there is none at position 0), then h_{end-1} becomes the stored one.
        `embeds` (rows of `tokens` [n], features [n, H]): the image rows among them."""
        assert mtp.kv[0].length == max(start - 1, 0), "MTP state out of step with the frontier"
        skip = int(start == 0)  # x_0 follows no hidden
        if skip:
            h_in, x_in = hidden[:-1], tokens[1:]
        else:
            h_in, x_in = torch.cat([mtp.hidden[None], hidden[:-1]]), tokens
        if len(x_in):
            first = start - 1 + skip  # the first pair's p
            positions = None if media is None else torch.from_numpy(media.positions_for(first, first + len(x_in)))
            if embeds is not None:
                keep = embeds[0] >= skip
                embeds = (embeds[0][keep] - skip, embeds[1][keep]) if bool(keep.any()) else None
            self.model.mtp_forward(h_in, torch.tensor(x_in), _view(mtp), step=0, positions=positions,
                                   embeds=embeds)
        mtp.hidden = hidden[-1].clone()

    def draft(self, mtp: MTPState, seq: ActiveSequence, ctx: RowContext, k: int
              ) -> tuple[tuple[int, ...], list[torch.Tensor | None]]:
        """The first draft from (h_{t-1}, pending), each next one from the previous MTP output and draft (the MTP
        layer applied recursively), on `mtp`, a private copy."""
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        h, x, view, media = mtp.hidden, seq.pending, _view(mtp), seq.media
        for j in range(k):
            at = seq.frontier - 1 + j  # the pair's p: h_{F-1} first, then each chained output
            positions = None if media is None else torch.from_numpy(media.positions_for(at, at + 1))
            logits, h_out = self.model.mtp_forward(h[None], torch.tensor([x]), view, step=j, return_hidden=True,
                                                   positions=positions)  # [1, V], [1, H]
            try:
                x, q = draw_draft(draft_vocabulary(logits[0], self.draft_vocab), ctx, seq.frontier + 1 + j, drafts)
            except SamplingError:
                break  # a draft distribution that cannot be drawn from ends the drafts, not the request
            drafts.append(x)
            qs.append(q)
            h = h_out[0]
        return tuple(drafts), qs
