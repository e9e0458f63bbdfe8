"""Turning one prepared prompt into an Engine submission: the shared step of the CLI and the HTTP server.

The output budget is explicit on every request (the Engine requires it): the caller's max_tokens, else whatever
the context leaves after the prompt, as vLLM does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ninfer.contracts import RejectReason, RequestRejected
from ninfer.engine.engine import GenerationHandle
from ninfer.engine.records import GenerationRequest
from ninfer.frontend import OutputOptions, PreparedPrompt, StructuredOutputOptions
from ninfer.runtime import Runtime
from ninfer.sampling import SamplingParams, resolve_seed


def output_budget(rt: Runtime, prompt_tokens: int, max_tokens: int | None) -> int:
    room = rt.max_context - prompt_tokens
    if max_tokens is None:
        if room < 1:
            raise RequestRejected(RejectReason.CONTEXT_TOO_LONG, f"prompt of {prompt_tokens} tokens leaves no room "
                                  f"in the context of {rt.max_context} tokens")
        return room
    rt.frontend.check_context(prompt_tokens, max_tokens)
    return max_tokens


def submit(rt: Runtime, prompt: PreparedPrompt, sampling: SamplingParams, **kw) -> GenerationHandle:
    """Open the request's OutputSession and submit it; raises RequestRejected (Frontend or Engine refusal)."""
    return rt.engine.submit(generation_request(rt, prompt, sampling, **kw))


def generation_request(rt: Runtime, prompt: PreparedPrompt, sampling: SamplingParams, *, stop: Sequence[str] = (),
                       structured: StructuredOutputOptions | None = None, skip_special_tokens: bool = True,
                       thinking_budget: int | None = None, session_key: str | None = None,
                       deadline: float | None = None) -> GenerationRequest:
    """The Engine request with its OutputSession opened (grammar compiled); RequestRejected if it cannot be."""
    if rt.engine is None:
        raise RequestRejected(RejectReason.UNREPRESENTABLE, "this server runs the scoring purpose; generation is "
                              "off (start it with --purpose generation)")
    budget = output_budget(rt, len(prompt), sampling.max_tokens)
    if sampling.max_tokens != budget:
        sampling = _with_max_tokens(sampling, budget)
    options = OutputOptions.create(sampling, stop=stop, skip_special_tokens=skip_special_tokens,
                                   thinking_budget=thinking_budget)
    session = rt.frontend.open_session(prompt, options, structured)
    if sampling.min_tokens and set(session.ending_token_ids) - set(sampling.stop_token_ids):
        # min_tokens blocks what ends the output, as the session sees it: <|im_end|>, a grammar's stop tokens
        sampling = replace(sampling, stop_token_ids=tuple(dict.fromkeys(sampling.stop_token_ids
                                                                         + session.ending_token_ids)))
    seed = rt.request_seed(sampling.seed)
    return GenerationRequest(tuple(prompt.token_ids), session, max_tokens=budget, sampling=sampling,
                             seed=None if seed is None else resolve_seed(seed), session_key=session_key,
                             capture_hints=tuple(b.length for b in prompt.boundaries), deadline=deadline,
                             media=prompt.media)


def _with_max_tokens(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    return replace(sampling, max_tokens=max_tokens, min_tokens=min(sampling.min_tokens, max_tokens))
