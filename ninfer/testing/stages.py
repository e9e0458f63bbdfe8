"""Pipeline stages against one stage (docs/pipeline.md): after the same schedule every rank's share of the fast
Program's pools (`assert_same_pools`) or of the reference Program's stores (`assert_same_stores`) holds the
single-stage Program's bytes."""

from __future__ import annotations

import torch


def assert_same_pools(one, staged) -> None:
    """Every page of every rank's KV plane, every slot of its GDN layers, its block tables, rank 0's MTP layer and
    hidden and rank 0's drafter context of `staged` (a FastProgram) equal `one`'s pools, bit for bit. The dummy page and slot are left out: warm-ups and the
    verify pass's pad rows write them, which no sequence reads (their GDN rows are never stepped), and so are the
    MTP draft's scratch pages, which it rewrites before each read."""
    cfg, whole = one.model.cfg, one.model.pools
    pages, slots = whole.plan.num_pages, whole.plan.slots
    for rank, pools in enumerate(staged.model.ranks):
        for kinds, pairs, n in ((cfg.attention_layers, ((pools.k, whole.k), (pools.v, whole.v)), pages),
                                (cfg.linear_layers, ((pools.conv, whole.conv), (pools.ssm, whole.ssm)), slots)):
            for j, layer in enumerate(staged.model.stages.owned(rank, kinds)):
                i = kinds.index(layer)
                assert all(torch.equal(part[j][:n], full[i][:n]) for part, full in pairs), \
                    f"rank {rank}'s pools differ at layer {layer}"
        assert torch.equal(pools.block_tables, whole.block_tables), f"rank {rank}'s block tables differ"
    if whole.dk is not None:  # the drafter's context K/V, rank 0's alone
        head = staged.model.pools
        assert torch.equal(head.dk[:, :pages], whole.dk[:, :pages]) and \
            torch.equal(head.dv[:, :pages], whole.dv[:, :pages]), "rank 0's drafter context differs"
        assert all(p.dk is None for p in staged.model.ranks[1:])
    if whole.mtp_hidden is not None:  # the MTP layer's KV follows rank 0's attention layers, as it does one stage's
        head = staged.model.pools
        assert torch.equal(head.k[-1][:pages], whole.k[-1][:pages]) and \
            torch.equal(head.v[-1][:pages], whole.v[-1][:pages]) and \
            torch.equal(head.mtp_hidden[:slots], whole.mtp_hidden[:slots]), "rank 0's MTP state differs"


def assert_same_stores(one, staged) -> None:
    """After the same schedule every page of every plane and every slot of every rank of `staged` (a
    ReferenceProgram) equals `one`'s store, bit for bit (the peaked test weights keep tokens through a stale K/V
    position; the bytes do not)."""
    for rank, plane in enumerate(staged.pages.planes):
        for j, layer in enumerate(plane.layers):
            i = one.pages.layers.index(layer)
            assert torch.equal(plane.k[:, j], one.pages.k[:, i]) and torch.equal(plane.v[:, j], one.pages.v[:, i]), \
                f"rank {rank}'s KV plane differs at layer {layer}"
    for rank, slots in enumerate(staged.states.ranks):
        for j, layer in enumerate(slots.layers):
            i = one.states.layers.index(layer)
            assert torch.equal(slots.conv[:, j], one.states.conv[:, i]) and \
                torch.equal(slots.recurrent[:, j], one.states.recurrent[:, i]), \
                f"rank {rank}'s GDN slots differ at layer {layer}"
