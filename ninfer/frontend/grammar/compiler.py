"""One GrammarCompiler per model: compiles StructuredOutputOptions into request-owned GrammarStates.

The compiler's cache is bounded (256 MiB by default), so repeated schemas compile once while a stream of
distinct schemas cannot grow memory without limit. A schema XGrammar refuses is the request's problem:
RequestRejected(UNREPRESENTABLE), before admission; so is one that compiles past the compile timeout. XGrammar's
messages are cut to their user-facing part: the C++ source location it prefixes is none of the client's business.

With a compile timeout (the server always has one) compiles run in killable worker processes (workers.py): a
compile past the timeout is killed, not left to finish on a thread, and so is one whose client went away
(workers.cancellable). A worker process the host refuses to start is the server's problem, not the request's:
RequestRejected(GRAMMAR_OVERLOADED or GRAMMAR_UNAVAILABLE), a 503. Without a timeout compiles run in this process.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict

import xgrammar as xgr

from ninfer.contracts import RejectReason, RequestRejected

from ..tokenizer import Qwen35Tokenizer
from .compose import structural_tag
from .options import StructuredOutputOptions
from .state import GrammarState
from .vocab import PADDED_VOCAB_SIZE, build_tokenizer_info
from .workers import CompileCancelled, CompileFailed, CompilerWorkers, CompileTimeout, WorkerLost, WorkerStartFailed

log = logging.getLogger("ninfer.frontend.grammar")
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
        self.compile_timeout = compile_timeout
        if compile_timeout is None:
            self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=True,
                                                cache_limit_bytes=cache_limit_bytes)
            self.workers = None
        else:
            # One single-threaded XGrammar per worker process: at most `max_threads` cores compile at once.
            self.workers = CompilerWorkers(self.info.serialize_json(), workers=max_threads, threads=1)
            self._cache = _CompiledCache(cache_limit_bytes)

    def compile(self, options: StructuredOutputOptions, *, reasoning: bool) -> xgr.CompiledGrammar:
        try:
            # Building the tag may refuse too (a tool parameter the call grammar cannot spell).
            tag = structural_tag(options, reasoning=reasoning)
            if self.workers is None:
                return self.compiler.compile_structural_tag(tag)
            return self._compile_in_worker(tag.model_dump_json())
        except (RuntimeError, ValueError, CompileFailed) as e:
            raise RequestRejected(RejectReason.UNREPRESENTABLE,
                                  f"structured output cannot be compiled: {user_message(e)}") from e

    def _compile_in_worker(self, key: str) -> xgr.CompiledGrammar:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        try:
            compiled_json = self.workers.compile(key, self.compile_timeout)
        except CompileTimeout:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, "structured output did not compile within "
                                  f"{self.compile_timeout:g} s (--grammar-compile-timeout); simplify the "
                                  "schema") from None
        except CompileCancelled:
            raise RequestRejected(RejectReason.CANCELLED, "the client went away while its structured output "
                                  "compiled") from None
        except WorkerLost as e:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, f"structured output was not compiled: {e}; "
                                  "retry, or simplify the schema") from None
        except WorkerStartFailed as e:
            raise _unavailable(e) from None
        compiled = xgr.CompiledGrammar.deserialize_json(compiled_json, self.info)
        self._cache.put(key, compiled)
        return compiled

    def new_state(self, options: StructuredOutputOptions, *, reasoning: bool) -> GrammarState | None:
        """A fresh GrammarState for one request, or None when nothing constrains its output."""
        if not options.constrained:
            return None
        return GrammarState(xgr.GrammarMatcher(self.compile(options, reasoning=reasoning)), self.vocab_size)

    def close(self) -> None:
        """Kill the worker processes (a compile still running gets its request's error)."""
        if self.workers is not None:
            self.workers.close()


def _unavailable(e: WorkerStartFailed) -> RequestRejected:
    """The server's fault, not the schema's: the OS's detail (paths, errno) goes to the log, the client learns
    whether to retry; requests without structured output are unaffected."""
    log.warning("%s", e)
    if e.transient:
        return RequestRejected(RejectReason.GRAMMAR_OVERLOADED, "the server could not start a process for "
                               "structured output compiles right now; retry later, or send the request without it")
    return RequestRejected(RejectReason.GRAMMAR_UNAVAILABLE, "structured output is unavailable on this server "
                           "(its grammar compiler cannot start); send the request without it")


class _CompiledCache:
    """Compiled grammars by structural tag, least recently used first out, bounded by XGrammar's size estimate."""

    def __init__(self, limit_bytes: int):
        self.limit, self.bytes = limit_bytes, 0
        self._lock = threading.Lock()  # the preparation threads compile concurrently
        self._entries: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()

    def get(self, key: str) -> xgr.CompiledGrammar | None:
        with self._lock:
            compiled = self._entries.get(key)
            if compiled is not None:
                self._entries.move_to_end(key)
            return compiled

    def put(self, key: str, compiled: xgr.CompiledGrammar) -> None:
        size = compiled.memory_size_bytes
        with self._lock:
            if size > self.limit or key in self._entries:
                return
            self._entries[key] = compiled
            self.bytes += size
            while self.bytes > self.limit:
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= dropped.memory_size_bytes
