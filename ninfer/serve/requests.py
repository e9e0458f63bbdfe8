"""From API bodies to Engine inputs, and from Engine results to API pieces: sampling, logprobs, usage, errors.

Token ids a client names (logit_bias keys, stop_token_ids, token prompts) and top_k are checked against the
vocabulary here (`SamplingParams.check_vocabulary`), before anything reaches the Engine: the sampler only meets them
when it runs, inside the Engine worker, where a bad one would end the request after admission.
"""

from __future__ import annotations

import re
from itertools import zip_longest
from typing import Any, Sequence

from ninfer.contracts import FinishReason, GenerationResult, RejectReason, RowFailure
from ninfer.sampling import SamplingParams, SamplingParamsError, resolve_seed
from ninfer.sampling.defaults import SamplingDefaults

from .errors import APIError, internal
from .schemas import _Sampling

_REASONS = {r.value: r for r in RejectReason}
# A logit_bias key is a token id in canonical decimal: int() would also take "05", "+5", " 5" and "1_000".
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]{0,18}")


def sampling_params(body: _Sampling, vocab_size: int, *, max_tokens: int | None, logprobs: int | None,
                    choice: int = 0, defaults: SamplingDefaults = SamplingDefaults()) -> SamplingParams:
    """The SamplingParams of choice `choice` (n > 1 choices get seed + j, as vLLM does); fields the body leaves
    unset come from the model's generation_config defaults, then OpenAI's (temperature 1)."""
    bias = {_token_id(key): value for key, value in (body.logit_bias or {}).items()}
    names = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty")
    fields: dict[str, Any] = {"temperature": 1.0, **defaults.fill({n: getattr(body, n) for n in names})}
    seed = None if body.seed is None else resolve_seed(body.seed, choice)
    try:
        params = SamplingParams.create(logit_bias=bias, stop_token_ids=body.stop_token_ids, seed=seed,
                                       max_tokens=max_tokens, min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
                                       logprobs=logprobs, **fields)
        params.check_vocabulary(vocab_size)
    except SamplingParamsError as e:
        raise APIError.from_sampling(e) from None
    return params


def _token_id(key: str) -> int:
    if not _TOKEN_KEY.fullmatch(key):
        raise APIError(400, f"logit_bias: key {key!r} is not a token id in canonical decimal (such as \"42\")",
                       param="logit_bias", code="invalid_value")
    return int(key)


def check_result(result: GenerationResult, *, draining: bool = False) -> None:
    """A result that carries an error becomes the matching API error: a rejection after submit keeps its message
    (the Engine wrote it for the client); a failure's detail goes to the log, never to the client."""
    if result.error is None:
        return
    if result.failure is not None:
        # the request's own constraints left nothing to draw (400); non-finite logits are the model's (500)
        if result.failure is RowFailure.NON_FINITE_LOGITS:
            raise internal(500, f"request {result.request_id}: {result.error}", code=result.failure.value,
                           what="the model produced non-finite logits for this request")
        raise APIError(400, result.error, code=result.failure.value)
    if result.finish_reason is FinishReason.REJECTED:
        reason = _REASONS.get(result.error.split(":", 1)[0])
        status = {RejectReason.QUEUE_TIMEOUT: 503, RejectReason.OVERLOADED: 429}.get(reason, 400)
        raise APIError(status, result.error, code=reason.value if reason else None)
    if result.finish_reason is FinishReason.CANCELLED:
        if draining:
            raise APIError(503, "the server is shutting down; the request was cancelled", code="shutting_down")
        raise APIError(499, "the request was cancelled", code="cancelled")
    if result.finish_reason is FinishReason.ERROR and result.error.startswith("engine failed"):
        raise internal(503, f"request {result.request_id}: {result.error}", code="engine_error")
    raise internal(500, f"request {result.request_id}: {result.error}")


def finish_reason(result: GenerationResult) -> str:
    reason = result.output.finish_reason if result.output is not None else result.finish_reason
    return {FinishReason.TOOL_CALLS: "tool_calls", FinishReason.LENGTH: "length",
            FinishReason.DEADLINE: "length"}.get(reason, "stop")


def usage(results: Sequence[GenerationResult], prompt_tokens: int | None = None) -> dict:
    """OpenAI usage over all choices: the prompt counted once (it is shared), completions summed."""
    completion = sum(r.usage.completion_tokens for r in results)
    reasoning = sum(r.output.reasoning_tokens for r in results if r.output is not None)
    prompt = results[0].usage.prompt_tokens if prompt_tokens is None else prompt_tokens
    cached = max((r.usage.cached_prompt_tokens for r in results), default=0)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached},
           "completion_tokens_details": {"reasoning_tokens": reasoning}}
    drafted = sum(r.usage.draft_tokens for r in results)
    if drafted:  # the usage extension of a speculative backend (absent without one: the OpenAI shape)
        out["speculative_decoding"] = {"draft_tokens": drafted,
                                       "accepted_draft_tokens": sum(r.usage.accepted_draft_tokens for r in results),
                                       # rounds by emitted tokens (index i: rounds that emitted i + 1)
                                       "acceptance_lengths": [sum(n) for n in zip_longest(
                                           *(r.usage.acceptance_lengths for r in results), fillvalue=0)]}
    return out


class TokenText:
    """Token ids as API strings and bytes (a token may hold part of a UTF-8 character: its bytes stay exact)."""

    def __init__(self, frontend):
        self.table = frontend.table

    def raw(self, token_id: int) -> bytes:
        try:
            return self.table.piece(token_id, False)
        except (KeyError, IndexError, TypeError):
            return b""  # an id past the tokenizer's vocabulary (padding rows of the embedding)

    def text(self, token_id: int) -> str:
        return self.raw(token_id).decode("utf-8", errors="replace")

    def chat_entry(self, token_id: int, logprob: float, top: Sequence[tuple[int, float]] = ()) -> dict:
        """One entry of chat `logprobs.content`."""
        raw = self.raw(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw),
                "top_logprobs": [{"token": self.text(t), "logprob": lp, "bytes": list(self.raw(t))} for t, lp in top]}


def delta_logprobs(ev: Any) -> list[tuple[int, float, tuple]]:
    """(token, logprob, top alternatives) per token of an OutputDelta whose request asked for logprobs."""
    lps = getattr(ev, "logprobs", None)
    if lps is None:
        if ev.token_ids:
            # Never answer with a silently empty list: the client asked, and the Engine did not publish them.
            raise APIError(501, "logprobs are not available: the Engine did not publish them for these tokens",
                           code="logprobs_unavailable")
        return []
    tops = getattr(ev, "top_logprobs", None) or [()] * len(lps)
    return [(t, lp, tuple(top)) for t, lp, top in zip(ev.token_ids, lps, tops)]
