"""One GrammarCompiler per model: compiles StructuredOutputOptions into request-owned GrammarStates.

The compiler's cache is bounded (256 MiB by default), so repeated schemas compile once while a stream of
distinct schemas cannot grow memory without limit. A schema XGrammar refuses is the request's problem:
RequestRejected(UNREPRESENTABLE), before admission.
"""

from __future__ import annotations

import xgrammar as xgr

from ninfer.contracts import RejectReason, RequestRejected

from ..tokenizer import Qwen35Tokenizer
from .compose import structural_tag
from .options import StructuredOutputOptions
from .state import GrammarState
from .vocab import PADDED_VOCAB_SIZE, build_tokenizer_info

DEFAULT_CACHE_BYTES = 256 << 20


class GrammarCompiler:
    def __init__(self, tokenizer: Qwen35Tokenizer, *, vocab_size: int = PADDED_VOCAB_SIZE,
                 cache_limit_bytes: int = DEFAULT_CACHE_BYTES, max_threads: int = 2):
        self.vocab_size = vocab_size
        self.info = build_tokenizer_info(tokenizer, vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=True,
                                            cache_limit_bytes=cache_limit_bytes)

    def compile(self, options: StructuredOutputOptions, *, reasoning: bool) -> xgr.CompiledGrammar:
        try:
            # Building the tag may refuse too (a tool parameter the call grammar cannot spell).
            return self.compiler.compile_structural_tag(structural_tag(options, reasoning=reasoning))
        except (RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RequestRejected(RejectReason.UNREPRESENTABLE,
                                  f"structured output cannot be compiled: {first}") from e

    def new_state(self, options: StructuredOutputOptions, *, reasoning: bool) -> GrammarState | None:
        """A fresh GrammarState for one request, or None when nothing constrains its output."""
        if not options.constrained:
            return None
        return GrammarState(xgr.GrammarMatcher(self.compile(options, reasoning=reasoning)), self.vocab_size)

    @property
    def cache_bytes(self) -> int:
        return self.compiler.get_cache_size_bytes()
