"""The ResourceManager's cache policy on its own (pure Python): values, victim order, demotion, capture choice,
the SessionIndex, and the counters."""

from __future__ import annotations

from ninfer.contracts import CheckpointId, CheckpointInfo, ResourceResult, SequenceHandle, TransitionKind, token_digest
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.retention import Retention, TerminalFacts, Worth

PROMPT = tuple(range(1, 200))


def info(cid: int, tokens: int, device: int = 1000, host: int = 0) -> CheckpointInfo:
    return CheckpointInfo(CheckpointId(cid), tokens, token_digest(PROMPT[:tokens]), device, host)


def retain(rm: ResourceManager, rid: int, ck: CheckpointInfo, key: str | None, order: int) -> None:
    rm.adopt(ResourceResult(rid, TransitionKind.RETAIN, True, 0, published=(ck,)), rid=rid, lane=None,
             session_key=key, publication_order=order)


def test_value_weighs_hits_recency_depth_class_and_bytes():
    base = Worth(Retention.PREFIX, 100, 10_000, 0, 0, False)
    assert Worth(Retention.PREFIX, 100, 10_000, 3, 0, False).value > base.value  # hits
    assert Worth(Retention.PREFIX, 100, 10_000, 0, 500, False).value < base.value  # idle
    assert Worth(Retention.PREFIX, 100, 20_000, 0, 0, False).value < base.value  # bytes
    assert Worth(Retention.TURN, 100, 10_000, 0, 0, False).value > base.value  # class
    assert Worth(Retention.PREFIX, 100, 10_000, 0, 0, True).value > base.value  # bound to a session
    assert Worth(Retention.PREFIX, 100, 10_000, 0, 0, False, superseded=True).value < base.value
    assert not base.demote and Worth(Retention.PREFIX, 100, 10_000, 1, 0, False).demote


def test_session_binding_is_read_first_and_only_a_later_completion_rebinds():
    rm = ResourceManager(2)
    retain(rm, 1, info(10, 50), "s", order=5)
    retain(rm, 2, info(11, 80), None, order=6)
    retain(rm, 3, info(12, 60), "s", order=4)  # an earlier request finishing later does not rebind
    assert rm.sessions["s"].checkpoint == CheckpointId(10)
    assert rm.find_source(PROMPT, "s").info.id == CheckpointId(11)  # deeper than the binding: the index wins
    assert rm.find_source(PROMPT[:70], "s").info.id == CheckpointId(12)
    retain(rm, 4, info(13, 90), "s", order=7)
    assert rm.sessions["s"].checkpoint == CheckpointId(13) and rm.find_source(PROMPT, "s").info.id == CheckpointId(13)
    other = PROMPT[:40] + (999,) * 60  # shares no checkpointed prefix
    assert rm.find_source(other, "s") is None
    rm.check_invariants()


def test_victims_lowest_value_first_and_demotion_of_the_used():
    rm = ResourceManager(1)
    retain(rm, 1, info(10, 150), None, 1)
    rm.adopt(ResourceResult(9, TransitionKind.CAPTURE, True, 0, published=(info(11, 20),)), rid=2, lane=None)
    choice = rm.materialize_choice(3, PROMPT, 4, None, None, 0)
    assert choice.source == CheckpointId(10)  # the deepest prefix
    assert choice.victims == (CheckpointId(11),) and not choice.demote  # the source is never a victim
    assert set(choice.captures) == {192, len(PROMPT)}  # past the source's 150: the prompt end and the chunk at 192
    rm.begin_materialize(3, 0, choice)
    rm.adopt(ResourceResult(3, TransitionKind.MATERIALIZE, True, 0, handle=SequenceHandle(0, 1), reused_tokens=150,
                            captures=choice.captures), rid=3, lane=0)
    victims = rm.victims()
    assert victims[-1] == CheckpointId(10) and CheckpointId(10) in rm.materialize_choice(4, (5,) * 30, 2, None,
                                                                                          None, 0).demote
    s = rm.stats
    assert (s.lookups, s.hits, s.hit_tokens, s.retained, s.captures) == (1, 1, 150, 1, 1)
    rm.check_invariants()


def test_terminal_retains_a_reproduced_output_or_a_session():
    rm = ResourceManager(1)
    h = SequenceHandle(0, 1)
    kinds = [rm.terminal_choice(h, TerminalFacts(1, 40, boundary, key, ok)).kind
             for boundary, key, ok in ((41, None, True), (40, None, True), (30, None, True), (None, "k", True),
                                       (41, None, False))]
    assert kinds == [TransitionKind.RETAIN, TransitionKind.RETAIN, TransitionKind.RELEASE, TransitionKind.RETAIN,
                     TransitionKind.RELEASE]
    assert ResourceManager(1, prefix_caching=False).terminal_choice(h, TerminalFacts(1, 40, 41, "k", True)).kind \
        is TransitionKind.RELEASE


def test_capture_choice_prefers_turn_boundaries_and_skips_what_is_held():
    rm = ResourceManager(1)
    rm.adopt(ResourceResult(9, TransitionKind.CAPTURE, True, 0, published=(info(11, 128),)), rid=2, lane=None)
    choice = rm.materialize_choice(3, PROMPT, 4, None, None, 0, hints=(30, 150, 197), from_root=True)
    assert choice.captures[:3] == (197, 150, 30) and 128 not in choice.captures  # turn boundaries first, deepest first
    assert set(choice.captures[3:]) <= {199, 192}


def test_the_device_share_bounds_what_checkpoints_hold():
    """Past `cache_device_share` of the KV pages held by inactive checkpoints only, the lowest-valued are deleted."""
    from ninfer.engine.config import EngineConfig
    from ninfer.engine.engine import Engine
    from ninfer.testing.sessions import token_request
    from ninfer.testing.toy_program import ToyProgram

    for share, bound in ((1.0, None), (0.25, 0.25)):
        program = ToyProgram(max_concurrency=1, total_pages=64, page_size=4, checkpoint_slots=8)
        engine = Engine(program, EngineConfig(max_concurrency=1, cache_device_share=share, check_invariants=True),
                        threaded=False)
        for seed in range(6):
            engine.submit(token_request(tuple((seed * 13 + i) % 90 + 1 for i in range(20)), 2))
            engine.run_until_idle()
        usage = program.resource_usage()
        if bound is None:
            assert usage.checkpoint_pages > 0.25 * usage.total_pages  # nothing trims an unbounded cache
        else:
            assert 0 < usage.checkpoint_pages <= bound * usage.total_pages
            assert engine.core.resources.stats.deletions > 0


def test_a_conversation_keeps_its_reuse_after_a_thousand_unrelated_requests():
    """One-off prompts (no turn boundary) never displace a conversation's checkpoints, however long it is idle:
    after 1,000 of them through a small catalog the conversation's next turn still reuses its whole context."""
    import random

    from ninfer.engine.config import EngineConfig
    from ninfer.engine.engine import Engine
    from ninfer.engine.records import GenerationRequest
    from ninfer.testing.sessions import TokenSession, token_request
    from ninfer.testing.toy_program import ToyProgram

    program = ToyProgram(max_concurrency=2, total_pages=96, page_size=4, checkpoint_slots=4, max_context=128)
    engine = Engine(program, EngineConfig(max_concurrency=2), threaded=False)
    rng = random.Random(5)
    turn1 = tuple(rng.randrange(1, 97) for _ in range(40))
    first = engine.submit(token_request(turn1, 2, capture_hints=(len(turn1) - 2,)))
    engine.run_until_idle()
    assert first.result(timeout=0).usage.cached_prompt_tokens == 0
    for n in range(1000):  # completions without a stop: no Frontend boundary, nothing retained
        one_off = tuple(rng.randrange(1, 97) for _ in range(8 + n % 20))
        handle = engine.submit(GenerationRequest(one_off, TokenSession(2, stop_ids=()), 2))
        engine.run_until_idle()
        handle.result(timeout=0)
    turn2 = turn1[:-2] + tuple(rng.randrange(1, 97) for _ in range(6))
    second = engine.submit(token_request(turn2, 2))
    engine.run_until_idle()
    cached = second.result(timeout=0).usage.cached_prompt_tokens
    assert cached == len(turn1) - 2 and cached >= 0.9 * len(turn1)
    assert engine.core.resources.stats.deletions > 100  # the one-off prompts' checkpoints churned through


def test_terminal_retention_classes():
    """OUTPUT where history reproduces the end (boundary at the frontier or past it), SESSION where only a session
    key asks, nothing for a failed or empty request."""
    from ninfer.engine.retention import terminal_retention

    cases = {(40, 40, None, True): Retention.OUTPUT, (40, 41, "k", True): Retention.OUTPUT,
             (40, 39, "k", True): Retention.SESSION, (40, None, "k", True): Retention.SESSION,
             (40, 39, None, True): None, (40, 40, "k", False): None, (0, 0, "k", True): None}
    for (frontier, boundary, key, ok), expected in cases.items():
        assert terminal_retention(TerminalFacts(1, frontier, boundary, key, ok)) is expected

