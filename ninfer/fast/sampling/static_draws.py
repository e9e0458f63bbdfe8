"""StaticDraws: the graph input data and outputs of the draft draws inside the MTP draft graphs
(`ninfer/fast/draft_graphs.py`, `SpecSampler.draw_static`), for up to max_batch drafting rows of k drafts each.

The parameter rows are the sample layout's (``ninfer.fast.ops.sample.layout``): row (b, j) draws draft j of row b
at its position frontier + 1 + j; they are copied in once a round from the round's `RowParams` (`load`, where the
variant reads them). The draft index j is a device scalar the step graph advances, so one graph serves every draft
position. The drafts, their processed logits z (q = softmax z, random rows) and the count of drawable drafts per row
are written here and copied into the round's `DraftBlock` after the last step (`store`).
"""

from __future__ import annotations

import torch

from ninfer.fast.hostcopy import to_device
from ninfer.fast.ops.sample import layout as L

from .draft_block import DraftBlock
from .row_params import RowParams
from .rows import GREEDY, SORT, TOP_K
from .spec_steps import Steps

NI, NF = L.INT_COLUMNS, L.FLOAT_COLUMNS


class StaticDraws:
    def __init__(self, max_batch: int, k: int, vocab: int, device: torch.device):
        self.max_batch, self.k = max_batch, k
        self.ip = torch.zeros(max_batch, k, NI, dtype=torch.int64, device=device)  # [M, k, NI]
        self.fp = torch.zeros(max_batch, k, NF, dtype=torch.float64, device=device)  # [M, k, NF]
        self.drafts = torch.zeros(max_batch, k, dtype=torch.long, device=device)  # [M, k]
        self.z = torch.zeros(max_batch, k, vocab, dtype=torch.float32, device=device)  # [M, k, V]
        self.num = torch.zeros(max_batch, dtype=torch.int32, device=device)  # drawable drafts so far
        self.room = torch.zeros(max_batch, dtype=torch.int32, device=device)  # k' of each row
        self.j = torch.zeros(1, dtype=torch.long, device=device)  # the draft index the next step draws

    def reset(self, B: int) -> None:
        """Graph-safe, at a draft's start: no drafts drawn (zeros, as a fresh `DraftBlock` has them), z -inf (a
        position never drawn has no q)."""
        self.drafts[:B].zero_()
        self.num[:B].zero_()
        self.j.zero_()
        self.z[:B].fill_(float("-inf"))

    def load(self, params: RowParams, steps: Steps, live: list[int], rows: int) -> torch.Tensor | None:
        """The round's parameter rows (ip [N * k, NI], fp [N * k, NF] of all N rows) of its drafting rows `live`
        (indices into the round's `rows` rows), in order, where the draw variant's `steps` read them (a lean greedy
        variant reads none: the rows are then neither built nor copied, `RowParams`). Returns `live` on the device
        [B] long where this or `store` needs it (parameter rows read, or fewer drafting rows than the round has),
        else None."""
        B = len(live)
        at = to_device(live, self.ip.device, torch.long) if steps.reads_params or B < rows else None
        if steps.reads_params:
            k = self.k
            self.ip[:B].copy_(params.ip.reshape(-1, k, NI).index_select(0, at))
            self.fp[:B].copy_(params.fp.reshape(-1, k, NF).index_select(0, at))
        return at

    def fill_dummy(self, B: int, variant: str, dummy_row: int) -> None:
        """Capture inputs: rows on the sampler tables' dummy row, every table flag off, greedy or not as the variant
        is (the cutoff variants with a top-k, so their steps run)."""
        ints = torch.zeros(B, NI, dtype=torch.int64)
        ints[:, L.ROW] = dummy_row
        ints[:, L.FLAGS] = L.GREEDY if variant == GREEDY else 0
        ints[:, L.TOP_K] = 1 if variant in (TOP_K, SORT) else 0
        floats = torch.ones(B, NF, dtype=torch.float64)
        floats[:, L.MIN_P] = floats[:, L.FREQUENCY] = floats[:, L.PRESENCE] = 0.0
        self.ip[:B].copy_(ints[:, None].expand(B, self.k, NI))
        self.fp[:B].copy_(floats[:, None].expand(B, self.k, NF))
        self.room[:B].fill_(self.k)

    def store(self, block: DraftBlock, live: torch.Tensor | None, B: int) -> None:
        """The drawn drafts into the round's block at its drafting rows `live` [B] long (None: every row of the
        block drafts, in order)."""
        if B == len(block):
            block.tokens.copy_(self.drafts[:B])
            block.num.copy_(self.num[:B])
            if block.z is not None:
                block.z.copy_(self.z[:B])
            return
        block.tokens.index_copy_(0, live, self.drafts[:B])
        block.num.index_copy_(0, live, self.num[:B])
        if block.z is not None:
            block.z.index_copy_(0, live, self.z[:B])
