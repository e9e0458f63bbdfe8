"""Value types of the output side: a request's output options, the chunk a commit publishes, the preview of
one PendingBatch row, and the final aggregate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ninfer.contracts import FinishReason, RowDecision

from .input_bounds import check_text
from .messages import ToolSpec
from .tokenizer import Qwen35Tokenizer
from .tool_calls import ToolCall, ToolCallDelta

EOS_TOKEN_IDS = (Qwen35Tokenizer.IM_END, Qwen35Tokenizer.ENDOFTEXT)


@dataclass(frozen=True)
class OutputOptions:
    """Everything an OutputSession knows about its request; nothing about the Engine."""

    max_tokens: int | None = None  # None: the Engine's context contract is the only limit
    min_tokens: int = 0  # the first min_tokens tokens never stop the output
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = EOS_TOKEN_IDS
    skip_special_tokens: bool = True
    thinking_budget: int | None = None  # reasoning tokens before a forced </think>
    tools: tuple[ToolSpec, ...] = ()  # tools whose calls are parsed; empty: no tool-call parsing

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise ValueError(f"min_tokens must be in 0..max_tokens, got {self.min_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        for i, s in enumerate(self.stop):
            check_text(s, f"stop[{i}]")
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise ValueError(f"thinking_budget must be >= 0, got {self.thinking_budget}")

    @classmethod
    def create(cls, sampling: Any = None, *, stop: Iterable[str] | str = (), tools: Iterable[ToolSpec] = (),
               skip_special_tokens: bool = True, thinking_budget: int | None = None) -> "OutputOptions":
        """From a ninfer.sampling.SamplingParams (max/min tokens, stop ids, ignore_eos) plus output fields."""
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if sampling is None:
            return cls(stop=stop, tools=tuple(tools), skip_special_tokens=skip_special_tokens,
                       thinking_budget=thinking_budget)
        eos = () if sampling.ignore_eos else EOS_TOKEN_IDS
        ids = tuple(dict.fromkeys(eos + tuple(sampling.stop_token_ids)))
        return cls(sampling.max_tokens, sampling.min_tokens, stop, ids, skip_special_tokens, thinking_budget,
                   tuple(tools))


@dataclass(frozen=True)
class OutputChunk:
    """What one commit lets the Engine publish."""

    token_ids: tuple[int, ...]
    text: str = ""
    reasoning_text: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class OutputPreview:
    """The effect of one PendingBatch row, computed on a fork; the session is unchanged until commit."""

    accepted: int  # tokens of the row this output takes (ends at a stop token or a completed stop string)
    terminal: bool
    finish_reason: FinishReason | None
    boundary: int | None  # relative index in the accepted span where history rendering reproduces the output
    chunk: OutputChunk
    forced: bool
    base_version: int
    state: Any  # the forked session state that commit adopts
    needs_control: bool = False  # once committed, the session asks for its forced-control suffix next

    def decision(self) -> RowDecision:
        return RowDecision(accepted=self.accepted, terminal=self.terminal, boundary=self.boundary)


@dataclass(frozen=True)
class OutputResult:
    """The final aggregate of one request's output."""

    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    completion_tokens: int
    reasoning_tokens: int
    token_ids: tuple[int, ...]
    stop_reason: str | int | None = None  # the stop string or stop token id that ended the output
    issues: tuple[str, ...] = ()  # e.g. malformed tool calls kept as content

    def as_openai_message(self) -> dict:
        """The assistant `message` of a chat.completion (reasoning under `reasoning_content`)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return message
