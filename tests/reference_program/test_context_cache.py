"""The context cache through the Engine on the reference Program: a full catalog makes room for new captures, turn
boundaries chosen by the ResourceManager carry a conversation whose rendering drops the generation prompt's tail,
and every hit equals the cold run."""

from __future__ import annotations

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.serving import assert_drained, cold
from ninfer.testing.sessions import token_request

DROPPED = 2  # tokens at the end of each prompt the next turn's rendering does not reproduce (an opened <think>)


def conversation(engine, prompt_of, seed: int, turns: int, *, session_key=None):
    """Turn n+1 is turn n's prompt without its last DROPPED tokens, then new tokens: only the Frontend's turn
    boundary (at len - DROPPED) is a prefix of the next prompt. Returns (prompt, result) per turn."""
    out, prompt = [], prompt_of(20, seed=seed)
    for turn in range(turns):
        hint = (len(prompt) - DROPPED,)
        handle = engine.submit(token_request(prompt, 3, capture_hints=hint, session_key=session_key))
        engine.run_until_idle()
        out.append((prompt, handle.result(timeout=0)))
        prompt = prompt[:-DROPPED] + prompt_of(9, seed=seed * 100 + turn)
    return out


def test_a_later_workload_recovers_its_reuse_after_the_catalog_filled(make_program, prompt_of):
    program = make_program(max_concurrency=1, checkpoint_slots=2, host_bytes=0)  # 4 state slots, no host tier
    engine = Engine(program, EngineConfig(max_concurrency=1, prefill_chunk=8, check_invariants=True), threaded=False)
    for seed in range(1, 5):  # earlier workloads fill every slot with their checkpoints
        for prompt, result in conversation(engine, prompt_of, seed, 3)[1:]:
            assert result.usage.cached_prompt_tokens == len(prompt) - 9
    usage = program.resource_usage()
    assert usage.checkpoints == usage.total_slots - 1  # full: only the slot a live state needs is free
    later = conversation(engine, prompt_of, 50, 4)
    for turn, (prompt, result) in enumerate(later):
        # each turn after the first resumes at the previous turn's boundary: only the 9 new tokens are prefilled
        assert result.usage.cached_prompt_tokens == (0 if turn == 0 else len(prompt) - 9), turn
        assert result.token_ids == cold(make_program, prompt, 3), turn
    stats = engine.core.resources.stats
    assert stats.deletions > 0 and stats.hits == 2 * 4 + 3 and stats.misses["cold"] == 5
    assert engine.available, engine.failure
    assert_drained(program)


def test_demoted_checkpoints_resume_from_the_host_replica(make_program, prompt_of):
    """With a host tier, checkpoints that earned hits are demoted instead of deleted, and resuming from the
    replica equals the cold run."""
    program = make_program(max_concurrency=1, checkpoint_slots=1)
    engine = Engine(program, EngineConfig(max_concurrency=1, prefill_chunk=8, check_invariants=True), threaded=False)
    first = conversation(engine, prompt_of, 7, 3)
    for seed in range(8, 11):
        conversation(engine, prompt_of, seed, 2)
    usage = program.resource_usage()
    replicas = [program.ckpts[c].tokens for c in program.ckpts if program.ckpts[c].slot is None]
    assert usage.host_checkpoints == len(replicas) > 0  # each replica holds its state and every KV page
    assert usage.checkpoint_host_bytes == sum(program.host.bytes_for(program.config.pages_for(len(t)))
                                              for t in replicas)
    assert engine.core.resources.stats.demotions > 0
    prompt = first[-1][0][:-DROPPED] + prompt_of(5, seed=99)  # the first conversation continues
    handle = engine.submit(token_request(prompt, 3))
    engine.run_until_idle()
    result = handle.result(timeout=0)
    assert result.usage.cached_prompt_tokens == len(first[-1][0]) - DROPPED
    assert result.token_ids == cold(make_program, prompt, 3)
    assert_drained(program)


def test_an_output_the_frontend_marks_is_retained_and_continued(make_program, prompt_of):
    """An output that ends at a Frontend boundary (TokenSession: its stop token) is retained without any session
    key, so the conversation's next request prefills only what is new; one that ends without it is released."""
    from ninfer.engine.records import GenerationRequest
    from ninfer.testing.sessions import TokenSession

    program = make_program()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefill_chunk=8, check_invariants=True), threaded=False)
    prompt = prompt_of(14, seed=31)
    out = cold(make_program, prompt, 6)
    stop = out[3]  # the output ends at its fourth token, a stop token with a boundary after it
    first = engine.submit(GenerationRequest(prompt, TokenSession(6, stop_ids=(stop,)), 6))
    engine.run_until_idle()
    done = first.result(timeout=0).token_ids
    assert done == out[:out.index(stop) + 1]
    nxt = prompt + done + prompt_of(5, seed=32)
    second = engine.submit(token_request(nxt, 3))
    engine.run_until_idle()
    result = second.result(timeout=0)
    assert result.usage.cached_prompt_tokens == len(prompt) + len(done) - 1  # all but the unconsumed stop token
    assert result.token_ids == cold(make_program, nxt, 3)
    stats = engine.core.resources.stats
    assert stats.retained == 1  # the second one ended at its length, with no boundary: released
    assert_drained(program)


def test_concurrent_conversations_keep_their_turns_after_an_idle_one(make_program, prompt_of):
    """An idle conversation leaves, per turn, turn boundaries its next turn passed over (a message end, the point
    before the dropped tokens) below the one it resumed from; they are superseded with it. Left protected they
    outranked (being deeper) every turn boundary of four new concurrent conversations, which then displaced each
    other's and missed their previous prompt (the GPU agent benchmark's 0 cached tokens at turns 2-4)."""
    program = make_program(max_concurrency=4, checkpoint_slots=8, host_bytes=0)  # the GPU benchmark's 16 slots
    engine = Engine(program, EngineConfig(max_concurrency=4, prefill_chunk=8, check_invariants=True), threaded=False)
    prompt = prompt_of(20, seed=1)
    for turn in range(8):  # the idle conversation: an agent loop, each turn extends the whole previous prompt
        hints = (len(prompt) - 6, len(prompt) - DROPPED)
        engine.submit(token_request(prompt, 2, capture_hints=hints))
        engine.run_until_idle()
        prompt = prompt + prompt_of(9, seed=100 + turn)
    prompts = [prompt_of(12, seed=10 + c) for c in range(4)]
    for turn in range(4):
        hints = [(len(p) - 6, len(p) - DROPPED) for p in prompts]
        handles = [engine.submit(token_request(p, 2, capture_hints=h)) for p, h in zip(prompts, hints)]
        engine.run_until_idle()
        for c, handle in enumerate(handles):
            cached = handle.result(timeout=0).usage.cached_prompt_tokens
            assert turn == 0 or cached >= len(prompts[c]) - 9 - DROPPED, (turn, c, cached, len(prompts[c]))
        prompts = [p + prompt_of(9, seed=200 + 10 * turn + c) for c, p in enumerate(prompts)]
    assert engine.available, engine.failure
    assert_drained(program)
