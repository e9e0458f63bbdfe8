"""POST /v1/chat/completions: render through the Frontend, submit n choices, answer whole or as SSE chunks.

Reasoning goes to `reasoning_content` and is mirrored as `reasoning` (vLLM's newer name); tool calls stream as
indexed fragments (id and name first, then argument pieces) and end the choice with finish_reason "tool_calls".
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request

from ninfer.contracts import GenerationResult, OutputDelta
from ninfer.frontend import ChatRequest

from .errors import APIError
from .events import Choices, choice_events
from .media import MediaPolicy, acquire_messages
from .requests import TokenText, check_result, delta_logprobs, finish_reason, sampling_params, usage
from .schemas import ChatCompletionRequest
from .sse import DONE, EventStream, error_event, event
from .state import ServerState
from .submit import generation_request


def _prepare(state: ServerState, body: ChatCompletionRequest):
    rt = state.runtime
    kwargs = {**rt.options.default_chat_template_kwargs, **(body.chat_template_kwargs or {})}
    messages = acquire_messages(body.messages, MediaPolicy.of_runtime(rt))
    request = ChatRequest(messages, tools=body.tools, tool_choice=body.tool_choice,
                          response_format=body.response_format, parallel_tool_calls=body.parallel_tool_calls,
                          chat_template_kwargs=kwargs, add_generation_prompt=body.add_generation_prompt,
                          json_whitespace=body.json_whitespace or rt.options.json_whitespace)
    return rt.frontend.prepare_chat(request, max_tokens=body.output_limit())


def _submit_all(state: ServerState, body: ChatCompletionRequest, deadline: float | None) -> list:
    rt = state.runtime
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    chat = _prepare(state, body)
    vocab = rt.frontend.tokenizer.vocab_size
    params = [sampling_params(body, vocab, max_tokens=body.output_limit(), logprobs=logprobs, choice=j,
                              defaults=rt.sampling_defaults)
              for j in range(body.n)]
    stops = body.stops()
    budget = body.requested_thinking_budget()
    budget = rt.options.thinking_token_budget if budget is None else budget
    return state.submit_choices(
        lambda p: generation_request(rt, chat.prompt, p, stop=stops, structured=chat.structured,
                                     skip_special_tokens=body.skip_special_tokens,
                                     thinking_budget=budget, deadline=deadline,
                                     session_key=body.session_key()), params)


async def chat_completions(body: ChatCompletionRequest, request: Request, state: ServerState) -> Any:
    state.check_model(body.model)
    state.require_generation()
    state.check_schema(body.response_format, body.tools)
    deadline = state.deadline()
    handles = await state.preparer.run(lambda: _submit_all(state, body, deadline), deadline=deadline,
                                       disconnected=request.is_disconnected, discard=state.abandon)
    choices = Choices(handles, state.metrics, state.active)
    choices.pump()
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name,
             "system_fingerprint": state.fingerprint}
    if body.stream:
        include = body.stream_options is not None and body.stream_options.include_usage
        return EventStream(_stream(state, choices, ident, include, body.logprobs, request.is_disconnected),
                           on_close=choices.close)
    return await _whole(state, choices, ident, request, body.logprobs)


def _message(result: GenerationResult) -> dict:
    out = result.output
    msg: dict[str, Any] = {"role": "assistant", "content": out.content}
    if out.reasoning:
        msg["reasoning_content"] = msg["reasoning"] = out.reasoning
    if out.tool_calls:
        msg["tool_calls"] = [c.as_openai() for c in out.tool_calls]
        msg["content"] = out.content or None
    return msg


async def _whole(state: ServerState, choices: Choices, ident: dict, request: Request, logprobs: bool) -> dict:
    text = TokenText(state.runtime.frontend)
    results: dict[int, GenerationResult] = {}
    lps: dict[int, list] = {i: [] for i in range(len(choices))}
    timer = state.metrics.timer()
    async for index, ev in choice_events(choices, request.is_disconnected):
        if isinstance(ev, OutputDelta):
            timer.tokens(index, len(ev.token_ids))
            if logprobs:
                lps[index].extend(text.chat_entry(*x) for x in delta_logprobs(ev))
        elif isinstance(ev, GenerationResult):
            results[index] = ev
    if len(results) < len(choices):
        raise APIError(499, "client disconnected")
    for r in results.values():
        check_result(r, draining=state.draining)
    ordered = [results[i] for i in range(len(choices))]
    timer.finish(ordered)
    choices = [{"index": i, "message": _message(r), "logprobs": {"content": lps[i]} if logprobs else None,
                "finish_reason": finish_reason(r), "stop_reason": r.output.stop_reason}
               for i, r in enumerate(ordered)]
    return {**ident, "object": "chat.completion", "choices": choices, "usage": usage(ordered)}


def _delta(ev: OutputDelta) -> dict:
    chunk = ev.delta
    delta: dict[str, Any] = {}
    if chunk.reasoning_text:
        delta["reasoning_content"] = delta["reasoning"] = chunk.reasoning_text
    if chunk.text:
        delta["content"] = chunk.text
    if chunk.tool_calls:
        calls = []
        for d in chunk.tool_calls:
            call: dict[str, Any] = {"index": d.index, "function": {"arguments": d.arguments}}
            if d.id is not None:
                call.update(id=d.id, type="function")
                call["function"]["name"] = d.name
            calls.append(call)
        delta["tool_calls"] = calls
    return delta


async def _stream(state: ServerState, choices: Choices, ident: dict, include_usage: bool, logprobs: bool,
                  disconnected) -> AsyncIterator[bytes]:
    base = {**ident, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    text = TokenText(state.runtime.frontend)
    timer = state.metrics.timer()
    results: dict[int, GenerationResult] = {}
    for i in range(len(choices)):
        yield event({**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}], **extra})
    async for index, ev in choice_events(choices, disconnected):
        if isinstance(ev, OutputDelta):
            timer.tokens(index, len(ev.token_ids))
            delta = _delta(ev)
            try:
                entries = [text.chat_entry(*x) for x in delta_logprobs(ev)] if logprobs else []
            except APIError as e:
                yield error_event(e.status, e.message, e.code)
                break
            if delta or entries:
                choice = {"index": index, "delta": delta, "logprobs": {"content": entries} if entries else None,
                          "finish_reason": None}
                yield event({**base, "choices": [choice], **extra})
        elif isinstance(ev, GenerationResult):
            try:
                check_result(ev, draining=state.draining)
            except APIError as e:
                yield error_event(e.status, e.message, e.code)
                break
            results[index] = ev
            yield event({**base, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                              "finish_reason": finish_reason(ev),
                                              "stop_reason": ev.output.stop_reason}], **extra})
    if len(results) == len(choices):
        ordered = [results[i] for i in range(len(choices))]
        timer.finish(ordered)
        if include_usage:
            yield event({**base, "choices": [], "usage": usage(ordered)})
    yield DONE
