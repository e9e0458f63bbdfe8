"""The real OutputSession under the real Engine (ToyProgram): commit order, deltas, forced control, results."""

from __future__ import annotations

from ninfer.contracts import FinishReason, GenerationResult, OutputDelta
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.frontend import ChatRequest, OutputOptions
from ninfer.testing.toy_program import ToyProgram


def run(fe, options, draft_tokens=3, reasoning=True):
    eng = Engine(ToyProgram(draft_tokens=draft_tokens, max_context=4096, vocab=248077), EngineConfig(max_concurrency=2),
                 threaded=False)
    kwargs = None if reasoning else {"enable_thinking": False}
    prompt = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], chat_template_kwargs=kwargs)).prompt
    sessions = [fe.open_session(prompt, options) for _ in range(2)]
    handles = [eng.submit(GenerationRequest(prompt.token_ids, s, s.options.max_tokens, seed=i))
               for i, s in enumerate(sessions)]
    eng.run_until_idle()
    return sessions, [list(h.events(timeout=0)) for h in handles]


def test_published_chunks_add_up_to_the_result(fe):
    sessions, streams = run(fe, OutputOptions(max_tokens=40, stop=("!!",)), reasoning=False)
    for s, events in zip(sessions, streams):
        final = events[-1]
        assert isinstance(final, GenerationResult) and final.output == s.result()
        chunks = [e.delta for e in events if isinstance(e, OutputDelta)]
        assert "".join(c.text for c in chunks) == final.output.content
        assert tuple(t for c in chunks for t in c.token_ids) == final.token_ids == final.output.token_ids
        assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        s.check_invariants()


def test_thinking_budget_runs_through_engine_control(fe):
    sessions, streams = run(fe, OutputOptions(max_tokens=30, thinking_budget=4, stop_token_ids=()))
    suffix = fe.think_end_suffix
    for s, events in zip(sessions, streams):
        r = s.result()
        ids = r.token_ids
        at = next(i for i in range(len(ids)) if ids[i:i + len(suffix)] == suffix)
        assert at >= 4 and r.finish_reason is FinishReason.LENGTH and len(ids) == 30
        assert r.reasoning_tokens == at + 2  # up to and including </think>
        assert "".join(e.delta.reasoning_text for e in events if isinstance(e, OutputDelta)) == r.reasoning
