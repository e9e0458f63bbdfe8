"""`check_invariants` against planted states: each condition must fire on the one state that breaks it alone (the
random hunts would still pass with a condition missing, since an unbroken Program never violates it)."""

from __future__ import annotations

import pytest

from ninfer.testing.protocol_driving import generate, materialize


def _decoding(make_program, prompt_of):
    prog = make_program()
    h = materialize(prog, prompt_of(10)).handle
    generate(prog, h, 1, chunk=16)
    prog.check_invariants()
    return prog, prog.sequence(h)


def test_a_block_table_past_the_frontier_is_caught(make_program, prompt_of):
    """One more page taken from the reservation than the frontier needs (a rollback that kept a provisional page):
    refcounts, reservation and commitment all still add up."""
    prog, seq = _decoding(make_program, prompt_of)
    seq.table.append(prog.alloc.take())
    seq.reserve_left -= 1
    with pytest.raises(AssertionError, match="does not cover the frontier"):
        prog.check_invariants()


def test_a_reference_count_no_holder_holds_is_caught(make_program, prompt_of):
    """A page referenced once more than its holders (a capture or a share that took a reference twice)."""
    prog, seq = _decoding(make_program, prompt_of)
    prog.alloc.ref(seq.table[0])
    with pytest.raises(AssertionError, match="refcounts differ"):
        prog.check_invariants()
