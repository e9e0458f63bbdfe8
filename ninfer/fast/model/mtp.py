"""The MTP head on the device: the draft model of the fast Program's speculative backend (docs/speculative.md).

    e = norm_emb(Embed[x_{p+1}]);  hn = norm_hid(h_p);  u = fc([e | hn]);  h' = mtp.norm(decoder layer(u))

Its state at frontier t is the MTP layer's KV over the pairs (h_p, x_{p+1}), p < t - 1, plus the stored hidden
h_{t-1} (``pools.mtp_hidden[slot]``, beside the slot's GDN state, so slot copies, backups and the host tier carry
it). The KV is paged in the sequence's own block table, in the k/v pools' extra layer: pair p at page position
p + 1, so a step from frontier F writes page positions >= F only and every position below a checkpoint's frontier
stays immutable and shareable. Its RoPE position is p (the reference's KV length; RoPE scores are relative), or for
a sequence with images p's MRoPE position (three rows, index + rope_delta after the prompt), with an image token
x_{p+1} embedded by its feature as the target embedded it (docs/speculative.md, "Images").

Attention reads pair p's keys 0..p, which sit at page positions 1..p+1: the row's keys are gathered into a private
paged buffer (one layer, whole context) where pair p sits at position p, and ``prefill_attention`` runs over it
(queries packed per row, causal). Drafting writes its chained pairs only into that buffer (the pages past the
frontier are not taken yet when drafts are made); advancing copies the new pairs back into the pages. Eager, but
no call reads a device value back: index tensors cross through pinned memory (``hostcopy.to_device``) and drafts
are drawn on the device (``draw``), so a round's only host sync is its acceptance readback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ninfer.contracts.media import PromptMedia
from ninfer.fast.hostcopy import to_device

from .kernels import Residual
from .layers import StepInputs, attention_mixer, ffn

if TYPE_CHECKING:
    from .model import FastModel


@dataclass
class _Gathered:
    """One attention call's private KV: rows' committed pairs copied to positions 0.., room for new ones after."""
    k: torch.Tensor  # [pages, page_size, nkv, d]
    v: torch.Tensor
    table: torch.Tensor  # [R, max pages] int32, row r's pages
    base: list[int]  # row r's first flat position in k/v (page-aligned)


class MtpHead:
    def __init__(self, model: "FastModel"):
        self.model, self.cfg, self.w = model, model.cfg, model.weights.mtp
        # the MTP layer's index in rank 0's pools.k / pools.v: after that rank's attention layers
        self.pool = len(model.stages.owned(0, model.cfg.attention_layers))
        self.hidden = model.pools.mtp_hidden  # [state_slots, H]

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, step: StepInputs, k_pages: torch.Tensor,
                v_pages: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] (h_p), embedded [T, H] (x_{p+1}'s input row: its embedding, an image token's feature) ->
        h' [T, H]; writes the T pairs' K/V into the pages [P, page_size, nkv, d] at ``step.slot_mapping`` and
        attends through ``step``'s table."""
        k, w, eps = self.model.kernels, self.w, self.cfg.rms_norm_eps
        e = k.rmsnorm(embedded, w.norm_embedding, eps)[0]
        hn = k.rmsnorm(hidden.to(e.dtype), w.norm_hidden, eps)[0]
        u = k.linear(torch.cat([e, hn], dim=-1), w.fc)  # [T, H]
        res = Residual(u)
        attention_mixer(k, self.cfg, w.layer.mixer, res, w.layer.input_norm, k_pages, v_pages, step)
        ffn(k, self.cfg, w.layer.ffn, res, w.layer.post_norm)
        return k.norm(res, w.norm, eps)

    def _flat_page_positions(self, row: int, first: int, n: int) -> torch.Tensor:
        """Flat pool indices (page * page_size + offset) of page positions first..first+n-1 of table row `row`."""
        ps, dev = self.model.plan.page_size, self.model.device
        pos = torch.arange(first, first + n, device=dev)
        return self.model.pools.block_tables[row, pos // ps].long() * ps + pos % ps

    def _gather(self, rows: Sequence[int], committed: Sequence[int], room: Sequence[int]) -> _Gathered:
        """Row r's `committed` pairs (page positions 1..) at positions 0.. of a private buffer with `room` more."""
        pools, ps = self.model.pools, self.model.plan.page_size
        n_pages = [max(1, -(-(c + m) // ps)) for c, m in zip(committed, room)]
        base = [0]
        for n in n_pages[:-1]:
            base.append(base[-1] + n)
        shape = (sum(n_pages), ps) + tuple(pools.k.shape[3:])
        kv = _Gathered(pools.k.new_empty(shape), pools.v.new_empty(shape),
                       to_device([[b + min(i, n - 1) for i in range(max(n_pages))] for b, n in zip(base, n_pages)],
                                 self.model.device), [b * ps for b in base])
        src = [self._flat_page_positions(r, 1, c) for r, c in zip(rows, committed) if c]
        if src:
            dst = torch.cat([torch.arange(b, b + c, device=self.model.device)
                             for b, c in zip(kv.base, committed) if c])
            src_all = torch.cat(src)
            for tmp, pool in ((kv.k, pools.k[self.pool]), (kv.v, pools.v[self.pool])):
                tmp.view(-1, *shape[2:])[dst] = pool.view(-1, *shape[2:])[src_all]
        return kv

    def _step(self, kv: _Gathered, sel: Sequence[int], first: Sequence[int], lens: Sequence[int],
              media: Sequence[PromptMedia | None] = ()) -> StepInputs:
        """Addressing of `lens[i]` new pairs of gathered row sel[i], starting at pair index first[i]; with a row
        of `media` (per entry of sel) that has images, the pairs rotate at their MRoPE positions."""
        dev = self.model.device
        i32 = dict(device=dev, dtype=torch.int32)
        pos = [f + j for f, n in zip(first, lens) for j in range(n)]
        slots = [kv.base[r] + f + j for r, f, n in zip(sel, first, lens) for j in range(n)]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        step = StepInputs(positions=to_device(pos, dev), slot_mapping=to_device(slots, dev, torch.long),
                          slot_ids=torch.zeros(len(sel), **i32), block_table=kv.table[to_device(sel, dev, torch.long)],
                          cu_seqlens=to_device(cu, dev), prefix_lens=to_device(first, dev))
        if any(m is not None for m in media):
            rope = [np.arange(f, f + n)[None].repeat(3, 0) if m is None else m.positions_for(f, f + n)
                    for m, f, n in zip(media, first, lens)]
            step.rope_positions = to_device(np.concatenate(rope, axis=1).tolist(), dev)  # [3, T] int32
        return step

    def advance(self, slots: Sequence[int], rows: Sequence[int], starts: Sequence[int], tokens: torch.Tensor,
                hidden: Sequence[torch.Tensor], media: Sequence[PromptMedia | None] | None = None,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Row i consumed its T_i tokens (packed along tokens [sum T_i] on the device, in row order) at starts[i]..
        with final-normed hidden[i] [T_i, H]: add the pairs this completes, (h_p, x_{p+1}) for p = starts[i]-1 ..
        starts[i]+T_i-2 (none for p < 0), to the MTP KV and store h_{starts[i]+T_i-1}. The reference MTP backend's
        `advance` (`reference/program/mtp_backend.py`), batched over rows. `media[i]`: row i's images (its MRoPE
        positions), `embeds` (rows of `tokens` [n] long, features [n, H]): the image rows the target embedded."""
        dev = self.model.device
        h_in, x_at, firsts, lens, offset = [], [], [], [], 0
        for slot, start, hid in zip(slots, starts, hidden):
            n = hid.shape[0]
            if start == 0:
                h_in.append(hid[:-1])
            else:
                h_in.append(torch.cat([self.hidden[slot][None], hid[:-1].to(self.hidden.dtype)]))
            x_at.extend(range(offset + (start == 0), offset + n))
            firsts.append(max(start - 1, 0))
            lens.append(n - (start == 0))
            offset += n
        sel = [i for i, n in enumerate(lens) if n]
        if sel:
            kv = self._gather(rows, firsts, lens)
            step = self._step(kv, sel, [firsts[i] for i in sel], [lens[i] for i in sel],
                              [media[i] for i in sel] if media else ())
            x = F.embedding(tokens, self.model.weights.embed)  # [sum T_i, H], the target's input rows
            if embeds is not None:
                x[embeds[0]] = embeds[1].to(x.dtype)
            x_in = x.index_select(0, to_device(x_at, dev, torch.long))
            self.forward(torch.cat([h_in[i] for i in sel]), x_in, step, kv.k, kv.v)
            # the new pairs back into the pages: pair p at page position p + 1
            dst = torch.cat([self._flat_page_positions(rows[i], firsts[i] + 1, lens[i]) for i in sel])
            src = step.slot_mapping
            pools = self.model.pools
            for tmp, pool in ((kv.k, pools.k[self.pool]), (kv.v, pools.v[self.pool])):
                pool.view(-1, *pool.shape[2:])[dst] = tmp.view(-1, *tmp.shape[2:])[src]
        for slot, hid in zip(slots, hidden):
            self.hidden[slot].copy_(hid[-1])

    def advance_paged(self, hidden: torch.Tensor, tokens: torch.Tensor, step: StepInputs, h_src: torch.Tensor,
                      slots: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor) -> None:
        """`advance` for blocks that all start past position 0, on the pages directly (the verify graphs' body, no
        host read): token t (x_{p+1}, at page position p + 1 = step.positions[t]) pairs with h_src[t] of
        [hidden [T, H] ; the stored hidden of `slots`], and its K/V land at the target's ``step.slot_mapping``; the
        attention reads keys 1..p + 1 of its row's pages (``step.first_keys``, ``step.context_lens``) and rotates at
        p. Then slot dst[i] stores hidden[rows[i]] (each row's slot its block's last, a step slot its position's;
        no slot but a scratch one twice)."""
        # index_select takes the int32 indices as they are (no cast launch each)
        h_in = torch.cat([hidden, self.hidden.index_select(0, slots)]).index_select(0, h_src)
        pools = self.model.pools
        self.forward(h_in, F.embedding(tokens, self.model.weights.embed), step, pools.k[self.pool],
                     pools.v[self.pool])
        self.store(dst, hidden.index_select(0, rows))

    def store(self, slots: torch.Tensor, hidden: torch.Tensor) -> None:
        """Slot slots[i] (int, on the device) stores hidden[i] [H] as its last final-normed hidden."""
        self.hidden.index_copy_(0, slots.long(), hidden.to(self.hidden.dtype))

    def draft(self, slots: Sequence[int], rows: Sequence[int], frontiers: Sequence[int], pending: Sequence[int],
              ks: Sequence[int], draw: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
              media: Sequence[PromptMedia | None] | None = None, draft_vocab: int | None = None) -> None:
        """max(ks) chained draft steps for the rows with ks[i] > 0 from their committed MTP state (nothing in the
        pools changes): the first from (h_{F-1}, pending), each next from the previous MTP output and draft, draft j
        the pair at F - 1 + j (its MRoPE position for a row of `media` with images).
        ``draw(j, live [b] long batch rows, logits [b, V]) -> tokens [b] long`` draws draft j on the device; a row
        past its own ks[i] drafts on (its extra drafts are never read), so no step waits for the host.
        `draft_vocab`: drafts from the token ids below it alone (`FastModel.logits`)."""
        dev = self.model.device
        live = [i for i, k in enumerate(ks) if k]
        if not live:
            return
        most = max(ks)
        committed = [frontiers[i] - 1 for i in live]
        kv = self._gather([rows[i] for i in live], committed, [most] * len(live))
        local = list(range(len(live)))  # each live row's index in kv
        h = self.hidden[to_device([slots[i] for i in live], dev, torch.long)]  # [b, H]
        x = to_device([pending[i] for i in live], dev, torch.long)
        at = to_device(live, dev, torch.long)
        rows_media = [media[i] for i in live] if media else ()
        for j in range(most):
            step = self._step(kv, local, [c + j for c in committed], [1] * len(live), rows_media)
            h = self.forward(h, F.embedding(x, self.model.weights.embed), step, kv.k, kv.v)
            x = draw(j, at, self.model.logits(h, draft_vocab))
