"""ForcedDrafts: a fault-injecting wrapper around a Program's speculative drafter, for any Program.

Random weights make the MTP head's drafts almost never right, so a test of speculation would only ever see blocks
of one token. This wrapper replaces each row's drafts by the target's own greedy continuation (computed from scratch
by a reference model over the row's committed tokens) cut at an acceptance length L drawn from the committed history, with
a wrong token at L: verification must then accept exactly L drafts for a greedy row, whatever L is, and any
acceptance length 0..k is exercised. Each draft's q is a point mass on it (a valid draft distribution: sampled rows
stay lossless). Drafts depend only on the committed state, so outputs stay schedule-invariant.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from ninfer.program_core import ActiveSequence
from ninfer.reference.model import ReferenceModel
from ninfer.reference.vision import VisionTower
from ninfer.sampling import RowContext, processed_logits


LOOKAHEAD = 8  # teacher tokens computed per miss


def _length(seq: ActiveSequence, k: int) -> int:
    """The forced acceptance length, a function of the committed history alone (not of the seed, which the Engine
    may draw at random for a greedy request), so runs replay."""
    key = f"{seq.frontier}:{seq.pending}:{seq.tokens[-8:]}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") % (k + 1)


class ForcedDrafts:
    def __init__(self, model: ReferenceModel, vision: VisionTower | None = None):
        """`vision`: the tower that encodes the images of a prompt with images (its teacher reads their
        features and MRoPE positions, as the Program's target does)."""
        self.model, self.vision = model, vision
        self.forced: list[tuple[int, int]] = []  # (acceptance length, drafts) of every row, for coverage checks
        self._memo: dict[tuple, list[int]] = {}  # (params, *consumed tokens, pending, *continuation[:i]) -> the rest

    def install(self, program: Any) -> Any:
        """Replace `program.executor.draft` by this wrapper; returns the program."""
        program.executor.draft = self
        return program

    def _continuation(self, seq: ActiveSequence, ctx: RowContext, n: int) -> list[int]:
        """The target's greedy tokens after the pending one (penalties and bias included, no grammar), from a memo
        while the committed tokens keep following an earlier continuation (each miss runs the model from scratch
        over the whole history, LOOKAHEAD tokens ahead)."""
        history = (ctx.params, *seq.tokens, seq.pending)
        ahead = self._memo.get(history)
        if ahead is None or len(ahead) < n:
            ahead = self._greedy(seq, ctx, max(n, LOOKAHEAD))
            for i in range(len(ahead)):
                self._memo[history + tuple(ahead[:i])] = ahead[i:]
        return list(ahead[:n])

    def _greedy(self, seq: ActiveSequence, ctx: RowContext, n: int) -> list[int]:
        state, media = self.model.new_state(), seq.media
        tokens = list(seq.tokens) + [seq.pending]
        logits = self.model.prefill(torch.tensor(tokens if media is None else media.model_ids(tokens)), state,
                                    chunked=False, **self._image_inputs(seq, len(tokens)))[-1]
        out: list[int] = []
        for j in range(n):
            z = processed_logits(logits.float(), ctx.at(seq.frontier + 1 + j, out, None))
            out.append(int(torch.argmax(z)))
            if j + 1 < n:
                at = seq.frontier + 1 + j
                positions = None if media is None else torch.from_numpy(media.positions_for(at, at + 1))
                logits = self.model.decode_step(out[-1], state, positions=positions)
        return out

    def _image_inputs(self, seq: ActiveSequence, n: int) -> dict:
        """The MRoPE positions [3, n] and image rows of a sequence with images (nothing for text)."""
        if seq.media is None:
            return {}
        images = seq.media.images
        feats = [self.vision.encode(torch.from_numpy(img.pixels), img.grid) for img in images]
        rows = torch.cat([torch.arange(img.offset, img.end) for img in images])
        return {"positions": torch.from_numpy(seq.media.positions_for(0, n)), "embeds": (rows, torch.cat(feats))}

    def __call__(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]
                 ) -> list[tuple[tuple[int, ...], list[torch.Tensor | None]]]:
        vocab = self.model.cfg.vocab_size
        out = []
        for seq, ctx, k in zip(seqs, ctxs, ks):
            if not k:
                out.append(((), []))
                continue
            length = _length(seq, k)
            self.forced.append((length, k))
            drafts = self._continuation(seq, ctx, k)
            if length < k:
                drafts[length] = (drafts[length] + 1) % vocab  # the first wrong draft
            q = [torch.nn.functional.one_hot(torch.tensor(d), vocab).double() for d in drafts]
            out.append((tuple(drafts), q))
        return out


class CyclingWidths:
    """A `DraftPolicy` stand-in that gives rounds the widths 1, 2, .., k + 1 in turn (every verify width, the plain
    step among them, whatever the acceptance), and records them."""

    def __init__(self, k: int):
        self.k, self.widths = k, []

    def width(self, rooms: Sequence[int]) -> int:
        self.widths.append(len(self.widths) % (self.k + 1) + 1)
        return self.widths[-1]

    def observe(self, width: int, offered: Sequence[int], produced: Sequence[int]) -> None:
        assert all(n <= width - 1 for n in offered), (width, offered)
