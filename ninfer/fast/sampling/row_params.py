"""RowParams: the sample-layout parameter rows of one speculative call (a round's drafts or its verified positions),
staged on the device only when something reads them.

A draft graph's lean greedy variant (no bias, mask, min_tokens, penalties or random row: `Steps.reads_params`
False) draws the argmax of the raw draft logits and never reads the rows, so a round of such drafts would fill and
copy them for nothing: the host fill of every (row, draft) pair and its pinned copy come to about a tenth of a
millisecond a round before the draft can launch (seventeenth session, `FastDFlashBackend.draft`'s staging). The
steps are known at once; the rows are built by `stage` on the first read of `ip` or `fp`, and kept.
"""

from __future__ import annotations

from typing import Callable

import torch

from ninfer.fast.ops.sample import layout as L

from .spec_steps import Steps

NI = L.INT_COLUMNS


class RowParams:
    """ip [N, NI] int64 and fp [N, NF] float64 on `device`, built from `stage()` (host int64 [N, NI + NF], the
    float columns' bits) on first read; `steps` the call's steps (a graph variant's where `draft_rows` chose one)."""

    def __init__(self, stage: Callable[[], torch.Tensor], device: torch.device, steps: Steps,
                 penalized: bool = True):
        self._stage, self._device, self._rows = stage, device, None
        self.steps = steps
        # some row has a penalty on (so each draft depends on the ones before it); `steps` may be a graph
        # variant's, which runs the penalty step for every call
        self.penalized = penalized

    def _staged(self) -> torch.Tensor:
        if self._rows is None:
            host = self._stage()
            self._rows = host.pin_memory().to(self._device, non_blocking=True) if self._device.type == "cuda" \
                else host.to(self._device)
        return self._rows

    @property
    def staged(self) -> bool:
        """Whether the rows were built and copied (a read of `ip` or `fp` happened)."""
        return self._rows is not None

    @property
    def ip(self) -> torch.Tensor:
        return self._staged()[:, :NI]

    @property
    def fp(self) -> torch.Tensor:
        return self._staged()[:, NI:].view(torch.float64)
