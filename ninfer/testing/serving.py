"""Driving a Program through an unthreaded Engine in tests: serve requests, serve them in turns, a cold run, and
the drained-pools check that every Program's Engine tests end with; and one resource transition driven by hand."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.sessions import token_request


def serve(program, requests: Sequence[Any], **config) -> list:
    """Submit every request at once, drain, and return the results in order (EngineConfig fields in `config`;
    invariants checked at every boundary)."""
    (results,) = in_turns(program, [requests], **config)
    return results


def in_turns(program, batches: Sequence[Sequence[Any]], **config) -> list[list]:
    """Serve the batches one after another on one Engine (later ones meet earlier checkpoints)."""
    engine = Engine(program, EngineConfig(check_invariants=True, **config), threaded=False)
    out = []
    for batch in batches:
        handles = [engine.submit(r) for r in batch]
        engine.run_until_idle()
        out.append([h.result(timeout=0) for h in handles])
    assert engine.available, engine.failure
    return out


def cold(make_program: Callable[[], Any], prompt, max_tokens: int) -> tuple[int, ...]:
    """The tokens of one request alone on a fresh Program with prefix caching off."""
    (result,) = serve(make_program(), [token_request(prompt, max_tokens)], max_concurrency=1, prefix_caching=False)
    return result.token_ids


def assert_drained(program, *, published: bool = False) -> None:
    """No sequence, reservation or page left but what inactive checkpoints hold; `published`: some checkpoint is."""
    u = program.resource_usage()
    assert u.active_sequences == u.reserved_pages == u.sequence_pages == 0, u
    assert u.free_pages + u.checkpoint_pages == u.total_pages, u
    assert u.free_slots + u.checkpoints - u.host_checkpoints == u.total_slots, u
    if published:
        assert u.checkpoints > 0, "prefix caching published nothing"


def run_transition(program, choice):
    """Plan, start and advance one resource transition to its end, as the Engine would; it must succeed, and the
    Program's invariants hold after it."""
    txn = program.start(program.plan(choice))
    while (result := program.advance(txn)) is None:
        pass
    assert result.succeeded, result
    program.check_invariants()
    return result
