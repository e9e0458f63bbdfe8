"""Response events the Engine publishes to a request's consumer, in order: one GenerationStart, output deltas,
then exactly one terminal GenerationResult."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .batch import RowFailure
from .states import FinishReason


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    reasoning_tokens: int = 0
    # Speculative decoding: drafts proposed for this request, drafts verification accepted, and its rounds by the
    # tokens each emitted (acceptance_lengths[i]: rounds that emitted i + 1 tokens). Zero / empty without a backend.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    acceptance_lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationStart:
    """Published once admission's resource choice is committed, before any delta (not after prefill)."""

    request_id: int
    prompt_tokens: int
    reused_prefix_tokens: int


@dataclass(frozen=True, slots=True)
class OutputDelta:
    """Committed tokens and what the request's OutputSession made of them (text, reasoning, tool-call pieces)."""

    request_id: int
    token_ids: tuple[int, ...]
    delta: Any = None  # the OutputSession's committed chunk for these tokens
    logprobs: tuple[float, ...] | None = None  # raw-distribution logprob of each token, when asked for
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None  # per token: (id, logprob) alternatives


@dataclass(frozen=True)
class GenerationResult:
    request_id: int
    finish_reason: FinishReason
    usage: Usage
    token_ids: tuple[int, ...] = ()
    output: Any = None  # the OutputSession's final result (content, reasoning, tool calls, ...)
    error: str | None = None
    failure: RowFailure | None = None  # set when the request ended alone because its token could not be drawn
