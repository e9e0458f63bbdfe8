"""`ninfer bench agent` against the in-process server (reference Program, random weights): turns of a growing
tool-calling conversation, alone and two at once; after turn 1 each turn prefills only its new tokens (or the 2
tokens of the previous prompt's opened "<think>\n" more). Three turns fit the shared 512-token test server; the
benchmark's ten turns run on a 1024-token one under `-m slow`."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ninfer.serve.app import create_app
from ninfer.serve.bench_agent import (AgentConfig, agent_targets, format_targets, format_turns, reuse_after_unrelated,
                                      run_agent_bench, summarize_turns)
from ninfer.serve.state import ServerState
from ninfer.runtime_options import RuntimeOptions
from ninfer.wiring import build_runtime


def check_agent_bench(runtime, turns_per_conversation: int) -> None:
    app = create_app(ServerState(runtime, runtime.name))
    n = turns_per_conversation
    for conversations in (1, 2):
        cfg = AgentConfig("http://bench", turns=n, concurrency=conversations, tool_result_len=6, max_tokens=1,
                          seed=conversations)
        turns = asyncio.run(run_agent_bench(cfg, transport=httpx.ASGITransport(app=app)))
        assert len(turns) == n * conversations and not any(t.error for t in turns)
        for t in turns:
            assert t.ttft_s > 0
            if t.turn == 1:
                assert t.new_tokens == t.prompt_tokens
            else:  # the previous prompt is reused (its end, or the point before its opened "<think>\n")
                assert t.prompt_tokens - t.new_tokens - 2 <= t.cached_tokens <= t.prompt_tokens - t.new_tokens, t
        s = summarize_turns(turns)
        assert s["max_excess_prefill"] <= 2 and [r["turn"] for r in s["turns"]] == list(range(1, n + 1))
        assert f"max prefilled - new after turn 1: {s['max_excess_prefill']} tokens" in format_turns(s, conversations)


def test_agent_turns_prefill_only_what_is_new(gen_runtime):
    check_agent_bench(gen_runtime, 3)


def test_reuse_after_unrelated_requests_and_the_targets(gen_runtime):
    """A conversation, 30 unrelated chat requests, then its next turn: it reuses the whole previous prompt (or all
    but the 2 tokens of its opened "<think>\n"); the targets say pass or fail from the numbers."""
    app = create_app(ServerState(gen_runtime, gen_runtime.name))
    cfg = AgentConfig("http://bench", turns=3, tool_result_len=6, max_tokens=1, seed=7)
    reuse = asyncio.run(reuse_after_unrelated(cfg, 30, transport=httpx.ASGITransport(app=app)))
    assert reuse["failed_unrelated"] == 0 and reuse["unrelated"] == 30, reuse
    assert reuse["previous_prompt_tokens"] - 2 <= reuse["cached_tokens"] <= reuse["previous_prompt_tokens"], reuse
    summary = {"turns": [{"turn": 1, "ttft_ms": 9.0}, {"turn": 2, "ttft_ms": 2.0}, {"turn": 3, "ttft_ms": 3.2}],
               "failed": 0, "max_excess_prefill": 2}
    targets = agent_targets({1: summary}, reuse)
    assert [t["pass"] for t in targets] == [True, False, True]  # TTFT grew 1.6x from turn 2 to turn 3
    assert targets[1]["value"] == pytest.approx(1.6)
    assert format_targets(targets).splitlines()[2].startswith("FAIL  TTFT <= 1.5x turn 2's")


@pytest.mark.slow
def test_ten_agent_turns_prefill_only_what_is_new():
    """The benchmark's ten turns: the tools system turn alone is ~280 tokens, so this needs a 1024-token server."""
    rt = build_runtime(RuntimeOptions(max_model_len=1024, max_num_seqs=2, seed=3), progress=False)
    try:
        check_agent_bench(rt, 10)
    finally:
        rt.close()
