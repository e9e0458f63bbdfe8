"""`ninfer bench agent` against the in-process server (reference Program, random weights): ten turns of a
growing tool-calling conversation, alone and two at once; after turn 1 each turn prefills only its new tokens."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ninfer.serve.app import create_app
from ninfer.serve.bench_agent import AgentConfig, format_turns, run_agent_bench, summarize_turns
from ninfer.serve.state import ServerState
from ninfer.wiring import RuntimeOptions, build_runtime


@pytest.fixture(scope="module")
def agent_runtime():
    """Room for ten turns: the tools system turn alone is ~280 tokens."""
    rt = build_runtime(RuntimeOptions(max_model_len=1024, max_num_seqs=2, seed=3), progress=False)
    yield rt
    rt.close()


def test_agent_turns_prefill_only_what_is_new(agent_runtime):
    app = create_app(ServerState(agent_runtime, agent_runtime.name))
    for conversations in (1, 2):
        cfg = AgentConfig("http://bench", turns=10, concurrency=conversations, tool_result_len=6, max_tokens=2,
                          seed=conversations)
        turns = asyncio.run(run_agent_bench(cfg, transport=httpx.ASGITransport(app=app)))
        assert len(turns) == 10 * conversations and not any(t.error for t in turns)
        for t in turns:
            assert t.ttft_s > 0
            if t.turn == 1:
                assert t.new_tokens == t.prompt_tokens
            else:  # the previous prompt is reused (its end, or the point before its opened "<think>\n")
                assert t.prompt_tokens - t.new_tokens - 2 <= t.cached_tokens <= t.prompt_tokens - t.new_tokens, t
        s = summarize_turns(turns)
        assert s["max_excess_prefill"] <= 2 and [r["turn"] for r in s["turns"]] == list(range(1, 11))
        assert f"max prefilled - new after turn 1: {s['max_excess_prefill']} tokens" in format_turns(s, conversations)
