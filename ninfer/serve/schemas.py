"""Request bodies of the OpenAI-compatible API (OpenAI fields plus vLLM's extras), validated by pydantic.

Shapes are checked here; value ranges that SamplingParams owns are checked there, and conversation structure is
the Frontend's. Types are strict: nothing is coerced (a string, a boolean or `1e3` is not an int, a string is not
a number), and NaN or infinite numbers are refused. Unknown fields are ignored, as OpenAI's accepted-and-ignored
ones (metadata, store, ...) are.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

from ninfer.sampling.params import INT64_MAX, MAX_LOGPROBS, SEED_MIN

MAX_CHOICES = 8  # n: at most the lanes a server can have
MAX_STOPS = 16
MAX_BATCH_PROMPTS = 64  # /v1/completions prompt lists (lm-eval batches are smaller)
MAX_CACHE_KEY = 256  # characters of a prompt_cache_key or user


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Body):
    """Sampling fields shared by chat and completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stop: Union[str, list[str], None] = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=INT64_MAX)  # int64, as vLLM and OpenAI
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI's prefix-cache routing hint (and `user`, its older stand-in): a lookup hint, never an owner of state
    prompt_cache_key: str | None = Field(None, max_length=MAX_CACHE_KEY)
    user: str | None = Field(None, max_length=MAX_CACHE_KEY)
    # vLLM extras
    top_k: int | None = None  # SamplingParams owns the range, and check_vocabulary its upper end
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = None  # SamplingParams owns the range
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True

    def session_key(self) -> str | None:
        """The SessionIndex key: prompt_cache_key, else user."""
        return self.prompt_cache_key if self.prompt_cache_key is not None else self.user

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > MAX_STOPS:
            from .errors import APIError
            raise APIError(400, f"at most {MAX_STOPS} stop strings", param="stop")
        if any(not s for s in stops):
            from .errors import APIError
            raise APIError(400, "stop strings must be non-empty", param="stop")
        return stops


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    # vLLM's name; `thinking_budget` is the older alias
    thinking_token_budget: int | None = Field(None, ge=0)
    thinking_budget: int | None = Field(None, ge=0)
    json_whitespace: str | None = None  # the final JSON's layout: compact or pretty (ninfer extra)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_thinking_budget(self) -> int | None:
        return self.thinking_token_budget if self.thinking_token_budget is not None else self.thinking_budget


PromptIds = list[int]


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], PromptIds, list[PromptIds]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)
    suffix: str | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True  # accepted for vLLM compatibility: Qwen3.5 adds no BOS either way
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
