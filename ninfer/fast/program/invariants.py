"""The fast Program's own invariants, on top of the Program core's (`ninfer.program_core.invariants`): each
device block-table row (on every pipeline stage) equals its host table, and the device sampler's output counts
equal the committed outputs."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from ninfer.program_core import invariants as core

if TYPE_CHECKING:
    from .program import FastProgram


def _check_device_rows(prog: "FastProgram") -> None:
    """On every pipeline stage: each rank's copy of the block tables."""
    for seq in itertools.chain(prog.seqs.values(), prog.prepared.values()):
        for rank in range(len(prog.store.ranks)):
            assert prog.store.read_row(seq.row, len(seq.table), rank) == seq.table, \
                f"{seq.handle}: rank {rank}'s device row differs"


def _check_sampling_counts(prog: "FastProgram") -> None:
    """Every sequence whose penalties read the device counts has them equal to its committed outputs."""
    tables = prog.sampler.tables
    for seq in prog.seqs.values():
        row = seq.row
        if tables.bound(row, seq.handle) and tables.counting[row] and not tables.invalid[row]:
            want = torch.bincount(torch.tensor(seq.outputs, dtype=torch.int64), minlength=tables.vocab)  # [V]
            assert torch.equal(tables.counts[row].cpu().long(), want), f"{seq.handle}: device counts differ"


def check_invariants(prog: "FastProgram") -> None:
    """The core's (refcounts, slot and row ownership, reservations, block-table coverage, the host tier), then
    the device rows against the host tables and the sampler's counts."""
    core.check_invariants(prog)
    _check_device_rows(prog)
    _check_sampling_counts(prog)
