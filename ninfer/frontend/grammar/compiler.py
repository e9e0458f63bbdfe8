"""One GrammarCompiler per model: compiles StructuredOutputOptions into request-owned GrammarStates.

The compiler's cache is bounded (256 MiB by default), so repeated schemas compile once while a stream of
distinct schemas cannot grow memory without limit. A schema XGrammar refuses is the request's problem:
RequestRejected(UNREPRESENTABLE), before admission; so is one that compiles past the compile timeout. XGrammar's
messages are cut to their user-facing part: the C++ source location it prefixes is none of the client's business.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import xgrammar as xgr

from ninfer.contracts import RejectReason, RequestRejected

from ..tokenizer import Qwen35Tokenizer
from .compose import structural_tag
from .options import StructuredOutputOptions
from .state import GrammarState
from .vocab import PADDED_VOCAB_SIZE, build_tokenizer_info

DEFAULT_CACHE_BYTES = 256 << 20
# "[23:15:10] /project/cpp/json_schema_converter.cc:5082: " before XGrammar's message, and any other source location.
_TIMESTAMP = re.compile(r"^\[[0-9:.]+\]\s*")
_SOURCE = re.compile(r"\S*\.(?:cc|cpp|cxx|h|hpp|py)(?::\d+)+:?\s*")


def user_message(error: BaseException) -> str:
    """The first line of an XGrammar error without its timestamp and source locations."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    cleaned = _SOURCE.sub("", _TIMESTAMP.sub("", first)).strip()
    return cleaned or type(error).__name__


class GrammarCompiler:
    def __init__(self, tokenizer: Qwen35Tokenizer, *, vocab_size: int = PADDED_VOCAB_SIZE,
                 cache_limit_bytes: int = DEFAULT_CACHE_BYTES, max_threads: int = 2,
                 compile_timeout: float | None = None):
        self.vocab_size = vocab_size
        self.info = build_tokenizer_info(tokenizer, vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=True,
                                            cache_limit_bytes=cache_limit_bytes)
        self.compile_timeout = compile_timeout
        # XGrammar releases the GIL while it compiles but cannot be interrupted: a compile past the timeout keeps
        # one of these threads until it ends, and its result is dropped. The Gateway's schema size bound keeps
        # such compiles rare; the pool keeps them from taking more than its threads.
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="ninfer-grammar")

    def compile(self, options: StructuredOutputOptions, *, reasoning: bool) -> xgr.CompiledGrammar:
        try:
            # Building the tag may refuse too (a tool parameter the call grammar cannot spell).
            tag = structural_tag(options, reasoning=reasoning)
            if self.compile_timeout is None:
                return self.compiler.compile_structural_tag(tag)
            future = self._pool.submit(self.compiler.compile_structural_tag, tag)
            try:
                return future.result(timeout=self.compile_timeout)
            except FutureTimeout:
                future.cancel()
                raise RequestRejected(RejectReason.UNREPRESENTABLE, "structured output did not compile within "
                                      f"{self.compile_timeout:g} s (--grammar-compile-timeout); simplify the "
                                      "schema") from None
        except (RuntimeError, ValueError) as e:
            raise RequestRejected(RejectReason.UNREPRESENTABLE,
                                  f"structured output cannot be compiled: {user_message(e)}") from e

    def new_state(self, options: StructuredOutputOptions, *, reasoning: bool) -> GrammarState | None:
        """A fresh GrammarState for one request, or None when nothing constrains its output."""
        if not options.constrained:
            return None
        return GrammarState(xgr.GrammarMatcher(self.compile(options, reasoning=reasoning)), self.vocab_size)

    @property
    def cache_bytes(self) -> int:
        return self.compiler.get_cache_size_bytes()
