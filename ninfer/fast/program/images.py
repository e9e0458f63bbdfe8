"""The fast Program's image inputs: what one prefill piece of a prompt with images hands to `FastModel.prefill`.

A prompt's image positions hold placeholder ids (their content identity, `ninfer.contracts.media`); the model
embeds the pad id there (`PromptMedia.model_ids`) and replaces those rows with the image's features from the
vision tower, rotating with the Frontend's 3-row MRoPE positions. An image is encoded whole when a prefill piece
first reaches its pads (a resume from a checkpoint inside an image encodes it again and takes the rest of its
rows); its features stay held for the later pieces that cover it and are freed by the piece that reaches its end.
At most `HELD` encodings are held at once (a request cancelled inside an image leaves its features to be evicted
first), which bounds the device memory this costs to `HELD` images' features (`FastProgram` budgets it).

The sampler's prompt-token tables see the model ids too (the pad id, never a placeholder), as the reference
Program's host draw does (`ReferenceExecutor._draw` passes `model_ids(prompt)`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch

from ninfer.fast.model.vision import FastVisionTower
from ninfer.program_core import ActiveSequence

HELD = 4  # encodings held at once: an image in progress per lane interleaving with others


class ModelHistory:
    """A sequence's history as the sampler's tables read it: the prompt in model ids. Computed only when read
    (when a table row is bound, or a host error reproduced), not on every draw."""

    def __init__(self, seq: ActiveSequence):
        self._seq = seq

    @property
    def prompt(self) -> list[int]:
        return self._seq.media.model_ids(self._seq.prompt)

    @property
    def outputs(self) -> Sequence[int]:
        return self._seq.outputs


class ImageInputs:
    def __init__(self, tower: FastVisionTower | None, device: torch.device):
        self.tower, self.device = tower, device
        self._held: OrderedDict[tuple, torch.Tensor] = OrderedDict()  # (digest, grid) -> features [n, H]

    def held(self) -> int:
        return len(self._held)

    def _features(self, img) -> torch.Tensor:
        key = (img.digest, img.grid)
        if key not in self._held:
            if self.tower is None:
                raise RuntimeError("a sequence with images reached a fast Program without the vision tower")
            # the host's pixels go straight into the tower's planned workspace
            self._held[key] = self.tower.encode(torch.from_numpy(img.pixels), img.grid)  # [tokens, H]
            while len(self._held) > HELD:
                self._held.popitem(last=False)
        self._held.move_to_end(key)
        return self._held[key]

    def prefill_args(self, seq: ActiveSequence, start: int, end: int) -> tuple[torch.Tensor, dict]:
        """(model ids [T] long, FastModel.prefill's rope_positions [3, T] int32 and embeds) of prompt indices
        start..end; the features of an image whose end this piece reaches are freed."""
        media = seq.media
        rows, feats = [], []
        for img in media.images:
            lo, hi = max(start, img.offset), min(end, img.end)
            if lo < hi:
                rows.append(torch.arange(lo - start, hi - start))
                feats.append(self._features(img)[lo - img.offset:hi - img.offset])
                if hi == img.end:
                    self._held.pop((img.digest, img.grid), None)
        tokens = torch.tensor(media.model_ids(seq.prompt[start:end]), dtype=torch.long, device=self.device)
        positions = torch.from_numpy(media.positions_for(start, end)).to(self.device, torch.int32)
        embeds = (torch.cat(rows).to(self.device), torch.cat(feats)) if rows else None
        return tokens, {"rope_positions": positions, "embeds": embeds}

    @staticmethod
    def rope_delta(seq: ActiveSequence) -> int:
        """Rotary position minus position after the prompt (0 for a text prompt)."""
        return 0 if seq.media is None else seq.media.rope_delta

    @staticmethod
    def feed_positions(seq: ActiveSequence, start: int, n: int, device: torch.device) -> torch.Tensor | None:
        """Rotary positions [3, n] int32 of n tokens fed at `start` (None for a text prompt)."""
        if seq.media is None:
            return None
        return torch.from_numpy(seq.media.positions_for(start, start + n)).to(device, torch.int32)
