"""Frontend: Qwen3.5 prompts (chat rendering, PreparedPrompt) and outputs (OutputSession: stops, reasoning,
tool calls, structured output through XGrammar)."""

from .frontend import ChatRequest, Frontend, PreparedChat
from .grammar import ResponseFormat, StructuredOutputOptions, ToolChoice
from .outputs import OutputChunk, OutputOptions, OutputPreview, OutputResult
from .prompt import PrefixDigest, PreparedPrompt
from .session import OutputSession
from .tool_calls import ToolCall, ToolCallDelta


def __getattr__(name: str):
    # xgrammar and torch load only when a grammar is first needed.
    if name in ("GrammarCompiler", "GrammarState"):
        from . import grammar
        return getattr(grammar, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChatRequest", "Frontend", "GrammarCompiler", "GrammarState", "OutputChunk", "OutputOptions",
           "OutputPreview", "OutputResult", "OutputSession", "PrefixDigest", "PreparedChat", "PreparedPrompt",
           "ResponseFormat", "StructuredOutputOptions", "ToolCall", "ToolCallDelta", "ToolChoice"]
