"""POST /v1/completions: text or token prompts (one or a batch), n choices each, `echo`, and logprobs.

Under the generation purpose it generates. Under the scoring purpose it is lm-eval's loglikelihood endpoint:
`echo` with max_tokens 0 or 1 returns every prompt token's logprob (the first is null: it has no prefix) and the
top-1 alternative at each position, from the CausalScoring core; max_tokens 1 appends the greedy next token.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ninfer.contracts import GenerationResult, OutputDelta, RequestRejected

from .errors import APIError
from .events import Choices, choice_events
from .requests import TokenText, check_result, delta_logprobs, finish_reason, sampling_params, usage
from .schemas import MAX_BATCH_PROMPTS, CompletionRequest
from .sse import DONE, EventStream, error_event, event
from .state import ServerState
from .submit import generation_request


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    p = body.prompt
    if isinstance(p, str):
        prompts: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [p]
    else:
        prompts = list(p)
    if not prompts:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise APIError(400, f"at most {MAX_BATCH_PROMPTS} prompts per request", param="prompt")
    return prompts


def _logprobs_block(text: TokenText, tokens: list[int], lps: list, tops: list, start: int = 0) -> dict:
    """The completions `logprobs` object: tokens, token_logprobs, top_logprobs ([{token: logprob}]), text_offset."""
    offsets, at = [], start
    strings = [text.text(t) for t in tokens]
    for s in strings:
        offsets.append(at)
        at += len(s)
    top = [None if t is None else {text.text(i): lp for i, lp in t} for t in tops]
    return {"tokens": strings, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


async def completions(body: CompletionRequest, request: Request, state: ServerState) -> Any:
    state.check_model(body.model)
    prompts = _prompts(body)
    ident = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name,
             "system_fingerprint": state.fingerprint}
    if state.runtime.scorer is not None:
        return await run_in_threadpool(_score_all, state, body, prompts, ident)
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of must equal n (choices are not ranked)", param="best_of")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs needs prompt logprobs: start the server with --purpose scoring",
                       param="echo", code="wrong_purpose")
    if body.stream and body.max_tokens == 0:
        raise APIError(400, "max_tokens 0 cannot stream", param="max_tokens")
    deadline = state.deadline()
    prepared = await state.preparer.run(lambda: _prepare(state, body, prompts), deadline=deadline,
                                        disconnected=request.is_disconnected)
    if body.max_tokens == 0:
        return _echo_only(state, body, prepared, ident)
    handles = await state.preparer.run(lambda: _submit_all(state, body, prepared, deadline), deadline=deadline,
                                       disconnected=request.is_disconnected, discard=state.abandon)
    choices = Choices(handles, state.metrics, state.active)
    choices.pump()
    if body.stream:
        include = body.stream_options is not None and body.stream_options.include_usage
        return EventStream(_stream(state, body, choices, ident, include, request.is_disconnected),
                           on_close=choices.close)
    return await _whole(state, body, prepared, choices, ident, request)


def _prepare(state: ServerState, body: CompletionRequest, prompts: list) -> list:
    fe = state.runtime.frontend
    limit = body.max_tokens or None
    try:
        return [fe.prepare_text(p, max_tokens=limit) if isinstance(p, str) else fe.prepare_tokens(p, max_tokens=limit)
                for p in prompts]
    except RequestRejected as e:
        raise APIError.from_rejection(e) from None


def _echo_text(state: ServerState, prompt) -> str:
    return prompt.text or state.runtime.frontend.tokenizer.decode(prompt.token_ids)


def _echo_only(state: ServerState, body: CompletionRequest, prepared: list, ident: dict) -> dict:
    choices = [{"index": i * body.n + j, "text": _echo_text(state, p) if body.echo else "", "logprobs": None,
                "finish_reason": "length"} for i, p in enumerate(prepared) for j in range(body.n)]
    n_prompt = sum(len(p) for p in prepared)
    return {**ident, "object": "text_completion", "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt}}


def _submit_all(state: ServerState, body: CompletionRequest, prepared: list, deadline: float | None) -> list:
    rt = state.runtime
    vocab = rt.frontend.tokenizer.vocab_size
    stops = body.stops()
    jobs = [(p, sampling_params(body, vocab, max_tokens=body.max_tokens, logprobs=body.logprobs, choice=j,
                                        defaults=rt.sampling_defaults))
            for p in prepared for j in range(body.n)]
    return state.submit_choices(lambda job: generation_request(rt, job[0], job[1], stop=stops, deadline=deadline,
                                                               skip_special_tokens=body.skip_special_tokens,
                                                               session_key=body.session_key()), jobs)


async def _whole(state: ServerState, body: CompletionRequest, prepared: list, choices: Choices, ident: dict,
                 request: Request) -> dict:
    text = TokenText(state.runtime.frontend)
    pieces: dict[int, list[str]] = {i: [] for i in range(len(choices))}
    lps: dict[int, list] = {i: [] for i in range(len(choices))}
    results: dict[int, GenerationResult] = {}
    timer = state.metrics.timer()
    async for index, ev in choice_events(choices, request.is_disconnected):
        if isinstance(ev, OutputDelta):
            timer.tokens(index, len(ev.token_ids))
            pieces[index].append(ev.delta.reasoning_text + ev.delta.text)
            if body.logprobs is not None:
                lps[index].extend(delta_logprobs(ev))
        elif isinstance(ev, GenerationResult):
            results[index] = ev
    if len(results) < len(choices):
        raise APIError(499, "client disconnected")
    ordered = [results[i] for i in range(len(choices))]
    for r in ordered:
        check_result(r, draining=state.draining)
    timer.finish(ordered)
    choices = []
    for i, r in enumerate(ordered):
        echo = _echo_text(state, prepared[i // body.n]) if body.echo else ""
        block = None
        if body.logprobs is not None:
            block = _logprobs_block(text, [t for t, _, _ in lps[i]], [lp for _, lp, _ in lps[i]],
                                    [top for _, _, top in lps[i]], start=len(echo))
        choices.append({"index": i, "text": echo + "".join(pieces[i]), "logprobs": block,
                        "finish_reason": finish_reason(r), "stop_reason": r.output.stop_reason})
    n_prompt = sum(len(p) for p in prepared) * body.n
    return {**ident, "object": "text_completion", "choices": choices, "usage": usage(ordered, n_prompt)}


async def _stream(state: ServerState, body: CompletionRequest, choices: Choices, ident: dict,
                  include_usage: bool, disconnected) -> AsyncIterator[bytes]:
    base = {**ident, "object": "text_completion"}
    extra = {"usage": None} if include_usage else {}
    text = TokenText(state.runtime.frontend)
    results: dict[int, GenerationResult] = {}
    timer = state.metrics.timer()
    async for index, ev in choice_events(choices, disconnected):
        if isinstance(ev, OutputDelta):
            timer.tokens(index, len(ev.token_ids))
            piece = ev.delta.reasoning_text + ev.delta.text
            try:
                got = delta_logprobs(ev) if body.logprobs is not None else []
            except APIError as e:
                yield error_event(e.status, e.message, e.code)
                break
            block = _logprobs_block(text, [t for t, _, _ in got], [lp for _, lp, _ in got],
                                    [top for _, _, top in got]) if got else None
            if piece or block:
                yield event({**base, "choices": [{"index": index, "text": piece, "logprobs": block,
                                                  "finish_reason": None}], **extra})
        elif isinstance(ev, GenerationResult):
            try:
                check_result(ev, draining=state.draining)
            except APIError as e:
                yield error_event(e.status, e.message, e.code)
                break
            results[index] = ev
            yield event({**base, "choices": [{"index": index, "text": "", "logprobs": None,
                                              "finish_reason": finish_reason(ev)}], **extra})
    if len(results) == len(choices):
        ordered = [results[i] for i in range(len(choices))]
        timer.finish(ordered)
        if include_usage:
            yield event({**base, "choices": [], "usage": usage(ordered, sum(r.usage.prompt_tokens for r in ordered))})
    yield DONE


def _score_all(state: ServerState, body: CompletionRequest, prompts: list, ident: dict) -> dict:
    """The scoring purpose: each prompt scored serially by the CausalScoring core."""
    rt = state.runtime
    if not body.echo or body.max_tokens not in (0, 1) or body.n != 1 or body.stream:
        raise APIError(400, "this server runs the scoring purpose: send echo=true, max_tokens 0 or 1, n=1, no "
                       "stream (lm-eval's loglikelihood request)", code="wrong_purpose")
    text = TokenText(rt.frontend)
    choices, n_prompt = [], 0
    for i, p in enumerate(prompts):
        try:
            if isinstance(p, str):
                rt.frontend.check_text_fits(p, 0)
        except RequestRejected as e:
            raise APIError.from_rejection(e) from None
        tokens = rt.frontend.tokenizer.encode(p) if isinstance(p, str) else list(p)
        if len(tokens) > rt.max_context:
            raise APIError(400, f"prompt {i} has {len(tokens)} tokens; the context is {rt.max_context}",
                           code="context_too_long")
        try:
            scored = rt.scorer.score(tokens, vocab_size=rt.frontend.tokenizer.vocab_size)
        except RequestRejected as e:
            raise APIError.from_rejection(e) from None
        state.metrics.scored_tokens += len(tokens)
        ids, lps, tops = list(tokens), [None, *scored.logprobs], [None, *([t] for t in scored.top)]
        if body.max_tokens == 1:
            ids.append(scored.next_top[0])
            lps.append(scored.next_top[1])
            tops.append([scored.next_top])
        block = _logprobs_block(text, ids, lps, tops) if body.logprobs is not None else None
        echo = p if isinstance(p, str) else rt.frontend.tokenizer.decode(tokens)
        generated = text.text(ids[-1]) if body.max_tokens == 1 else ""
        choices.append({"index": i, "text": echo + generated, "logprobs": block, "finish_reason": "length"})
        n_prompt += len(tokens)
    out = len(prompts) * body.max_tokens
    return {**ident, "object": "text_completion", "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": out, "total_tokens": n_prompt + out}}
