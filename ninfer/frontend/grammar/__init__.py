"""Structured output through XGrammar: options, the composed grammar, the compiler and request state.

The compiler and state import xgrammar (and torch); they load on first use, so preparing unconstrained
requests, or importing the tokenizer, never pays for them.
"""

from .options import ResponseFormat, StructuredOutputOptions, ToolChoice

_LAZY = {"GrammarCompiler": "compiler", "GrammarState": "state"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GrammarCompiler", "GrammarState", "ResponseFormat", "StructuredOutputOptions", "ToolChoice"]
