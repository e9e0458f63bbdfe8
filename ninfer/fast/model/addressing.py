"""The addressing a fast forward pass runs at (``StepInputs``), built for one rank's block tables: a prefill piece's
(host ints), a padded prefill piece's (device data only: a CUDA graph's body), the multi-query verify pass's
(host lists queued through pinned memory), and a built one moved to a later pipeline stage's device. Decode's is
one kernel of the op table (``FastModel.decode_inputs``)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ninfer.fast.hostcopy import to_device
from ninfer.fast.memory import MemoryPlan

from .layers import StepInputs


def verify_inputs(plan: MemoryPlan, block_tables: torch.Tensor, slots: Sequence[int], rows: Sequence[int],
                  starts: Sequence[int], lens: Sequence[int], keep_steps: bool = False) -> StepInputs:
    """The blocks' addressing over ``block_tables`` (one rank's, on its device), built on the host and queued
    through pinned memory (no host sync)."""
    dev, ps = block_tables.device, plan.page_size
    table = block_tables.index_select(0, to_device(rows, dev))  # [B, max_pages]
    pos_host = [s + j for s, n in zip(starts, lens) for j in range(n)]
    pos = to_device(pos_host, dev, torch.long)  # [N]
    block = to_device([i for i, n in enumerate(lens) for _ in range(n)], dev, torch.long)  # [N]
    pages = table[block, pos // ps].long()
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    reads, writes = step_slots(plan, slots, rows, lens, keep_steps)
    steps = [(to_device([cu[i] + j for i, n in enumerate(lens) if n > j], dev, torch.long),
              to_device([r[j] for r, n in zip(reads, lens) if n > j], dev),
              to_device([w[j] for w, n in zip(writes, lens) if n > j], dev)) for j in range(max(lens))]
    outs = to_device([w[j] if n > j else -1 for j in range(max(lens)) for w, n in zip(writes, lens)], dev)
    return StepInputs(positions=pos.to(torch.int32), slot_mapping=pages * ps + pos % ps,
                      slot_ids=to_device(slots, dev), block_table=table, cu_seqlens=to_device(cu, dev),
                      max_prefix=max(starts), prefix_lens=to_device(starts, dev), gdn_steps=steps,
                      gdn_outs=outs.view(max(lens), len(lens)))


def prefill_inputs(block_tables: torch.Tensor, page_size: int, n: int, slot: int, row: int, start: int,
                   captures: tuple[tuple[int, int], ...] = ()) -> StepInputs:
    """A prefill piece's addressing over ``block_tables`` (one rank's): n tokens of the sequence at GDN slot
    ``slot`` and table row ``row`` from position ``start``."""
    dev, ps = block_tables.device, page_size
    table = block_tables[row:row + 1]  # [1, max_pages]
    pos = torch.arange(start, start + n, device=dev, dtype=torch.int32)
    pages = table[0, (pos // ps).long()].long()
    i32 = dict(device=dev, dtype=torch.int32)
    # filled on the device: a tensor built from a host list is a pageable copy, which waits for the stream
    return StepInputs(positions=pos, slot_mapping=pages * ps + (pos % ps).long(),
                      slot_ids=torch.full((1,), slot, **i32), block_table=table,
                      cu_seqlens=torch.arange(0, 2 * n, n, **i32), prefix_lens=torch.full((1,), start, **i32),
                      prefill_slot=slot, captures=captures, max_prefix=start)


def mixed_inputs(block_tables: torch.Tensor, page_size: int, n: int, slot: int, row: int, start: int,
                 captures: tuple[tuple[int, int], ...], slots: Sequence[int], rows: Sequence[int],
                 frontiers: Sequence[int]) -> StepInputs:
    """One decode token of each of B sequences (at ``slots``, ``rows``, positions ``frontiers``), then a prefill
    piece (n tokens of the sequence at GDN slot ``slot`` and table row ``row`` from ``start``), packed as T = B + n
    rows over ``block_tables`` (one rank's). Attention sees B + 1 causal blocks with their prefixes (a decode row
    is a block of one, as in the verify pass); the GDN layers run the decode rows through the recurrence
    (``decode_rows``) and the piece through the chunked rule."""
    dev, ps, B = block_tables.device, page_size, len(slots)
    table = block_tables.index_select(0, to_device([*rows, row], dev))  # [B + 1, max_pages]
    pos = to_device([*frontiers, *range(start, start + n)], dev)  # [T] int32
    block = to_device([*range(B), *[B] * n], dev, torch.long)  # [T] each row's table row
    pages = table[block, (pos // ps).long()].long()
    return StepInputs(positions=pos, slot_mapping=pages * ps + (pos % ps).long(),
                      slot_ids=to_device([*slots, slot], dev), block_table=table,
                      cu_seqlens=to_device([*range(B + 1), B + n], dev),
                      prefix_lens=to_device([*frontiers, start], dev),
                      prefill_slot=slot, captures=captures, max_prefix=max(start, *frontiers),
                      decode_rows=to_device(range(B), dev, torch.long))


def padded_mixed_inputs(block_tables: torch.Tensor, page_size: int, n: int, slot: torch.Tensor, row: torch.Tensor,
                        start: torch.Tensor, length: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
                        frontiers: torch.Tensor) -> StepInputs:
    """`mixed_inputs` from device data only (a mixed CUDA graph's body): B decode rows (``slots``, ``rows``,
    ``frontiers`` [B] int32), then a piece padded to n rows of which the first ``length`` are real ([1] int32 each,
    as `padded_inputs`): padding rows write no KV and sit outside every attention block."""
    B, dev, ps = slots.shape[0], block_tables.device, page_size
    i32 = dict(device=dev, dtype=torch.int32)
    table = block_tables.index_select(0, torch.cat([rows, row]))  # [B + 1, max_pages]
    offsets = torch.arange(n, **i32)  # [n]
    pos = torch.cat([frontiers, start + offsets])  # [T]
    block = torch.cat([torch.arange(B, device=dev), torch.full((n,), B, device=dev)])  # [T] long
    pages = table[block, (pos // ps).clamp(max=table.shape[1] - 1).long()].long()
    real = torch.cat([torch.ones(B, device=dev, dtype=torch.bool), offsets < length])
    slot_mapping = torch.where(real, pages * ps + (pos % ps).long(), -1)
    cu = torch.cat([torch.arange(B + 1, **i32), B + length])  # [B + 2]: the pads are in no block
    return StepInputs(positions=pos, slot_mapping=slot_mapping, slot_ids=torch.cat([slots, slot]), block_table=table,
                      cu_seqlens=cu, prefix_lens=torch.cat([frontiers, start]), length=length,
                      decode_rows=torch.arange(B, device=dev))


def padded_inputs(block_tables: torch.Tensor, page_size: int, device: torch.device, n: int, slot: torch.Tensor,
                  row: torch.Tensor, start: torch.Tensor, length: torch.Tensor) -> StepInputs:
    """A padded piece's addressing, from device data only: padding rows get KV slot -1 (written nowhere) and a
    page index clamped into the table (their positions may run past the context)."""
    i32 = dict(device=device, dtype=torch.int32)
    ps = page_size
    offsets = torch.arange(n, **i32)  # [n]
    pos = start + offsets
    table = block_tables.index_select(0, row)  # [1, max_pages]
    pages = table[0, (pos // ps).clamp(max=table.shape[1] - 1).long()].long()
    slot_mapping = torch.where(offsets < length, pages * ps + (pos % ps).long(), -1)
    cu = torch.cat([torch.zeros(1, **i32), length])  # [0, length]: attention's queries are the real rows
    # the slot id long: the GDN state is gathered from and scattered back to it (index_copy_ takes long ids)
    return StepInputs(positions=pos, slot_mapping=slot_mapping, slot_ids=slot.long(), block_table=table,
                      cu_seqlens=cu, prefix_lens=start, length=length)


def moved(step: StepInputs, device: torch.device) -> StepInputs:
    """``step`` with its tensors on ``device`` (the block tables are equal on every rank, so rank 0's rows serve)."""
    def on(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x
    fields = {f.name: on(getattr(step, f.name)) for f in dataclasses.fields(step)}
    if step.gdn_steps is not None:
        fields["gdn_steps"] = [tuple(map(on, s)) for s in step.gdn_steps]
    return StepInputs(**fields)


def step_slots(plan: MemoryPlan, slots: Sequence[int], rows: Sequence[int], lens: Sequence[int], keep: bool
               ) -> tuple[list[list[int]], list[list[int]]]:
    """The slots each block's GDN steps read and write: in place on the block's slot, or (``keep``) step j writing
    the row's step slot j but the last step, which writes the slot, and each step reading the one before's."""
    reads, writes = [], []
    for slot, row, n in zip(slots, rows, lens):
        out = [plan.step_slot(row, j) for j in range(n - 1)] + [slot] if keep else [slot] * n
        reads.append([slot] + out[:-1])
        writes.append(out)
    return reads, writes


def piece_rows(embeds: tuple[torch.Tensor, torch.Tensor] | None, start: int, n: int):
    """The (rows, features) of ``embeds`` inside the prefill piece [start, start + n), rows relative to it."""
    if embeds is None:
        return None
    rows, feats = embeds
    inside = (rows >= start) & (rows < start + n)
    return (rows[inside] - start, feats[inside]) if bool(inside.any()) else None
