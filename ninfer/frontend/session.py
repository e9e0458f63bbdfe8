"""OutputSession: one request's output semantics, advanced only by preview -> commit.

Per token: grammar (if any) -> stop token -> UTF-8-safe detokenization -> stop strings (held back until
decided) -> reasoning / content / tool-call channels. `preview(tokens)` runs that pipeline on a fork of the
session state and reports how many tokens the output accepts, whether it ends and why, and the chunk to
publish; `commit(preview)` adopts the fork and returns the chunk (only then may the Engine publish it).
A dropped preview (abort, cancellation) leaves the session exactly as it was. The session sees tokens and its
own options only; it knows nothing of lanes, batches or the Program.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ninfer.contracts import DraftMasks, EngineFailure, FinishReason

from .channels import REASONING, ChannelParser, Parsed
from .detokenizer import Detokenizer, TokenTable
from .history import HistoryCheck
from .outputs import EOS_TOKEN_IDS, OutputChunk, OutputOptions, OutputPreview, OutputResult
from .stops import StopMatcher
from .tokenizer import Qwen35Tokenizer
from .tool_calls import ToolCall

if TYPE_CHECKING:
    from .grammar.state import GrammarState


@dataclass
class _State:
    """Everything a preview forks; small, so a fork per row per step is cheap."""

    detok: Detokenizer
    stops: StopMatcher
    parser: ChannelParser
    grammar: GrammarState | None
    generated: int = 0
    reasoning_tokens: int = 0
    forced_suffix: bool = False

    def fork(self) -> "_State":
        # every field copied, the mutable ones cloned; not dataclasses.replace, whose field introspection and
        # __init__ round trip were a quarter of a preview's cost (a fork per row per step)
        twin = object.__new__(_State)
        twin.__dict__.update(self.__dict__)
        twin.detok, twin.stops, twin.parser = self.detok.clone(), self.stops.clone(), self.parser.clone()
        twin.grammar = self.grammar.fork() if self.grammar is not None else None
        return twin


@dataclass
class _Delta:
    tokens: list
    parsed: Parsed
    calls: list


class OutputSession:
    def __init__(self, options: OutputOptions, table: TokenTable, *, reasoning_open: bool,
                 grammar: GrammarState | None = None, control_suffix: Sequence[int] = (),
                 history: HistoryCheck | None = None):
        self.options = options
        self._history = history  # whether history rendering reproduces the output: its prefix-execution boundary
        self._suffix = tuple(control_suffix)
        prefix = secrets.token_hex(6)
        parser = ChannelParser(reasoning_open, options.tools, lambda i: f"call_{prefix}{i:02d}",
                               drop_unterminated=grammar is not None)
        self._state = _State(Detokenizer(table, options.skip_special_tokens), StopMatcher(options.stop), parser,
                             grammar)
        self._version = 0
        self._mask = None  # one bitmask row per session, refilled for every sampled token
        self._tokens: list[int] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._issues: list[str] = []
        self._finish: FinishReason | None = None
        self._stop_reason: str | int | None = None

    @property
    def grammar(self) -> GrammarState | None:
        """The committed grammar state: fill bitmasks from it (or from its forks, for drafts)."""
        return self._state.grammar

    def next_token_mask(self):
        """The int32 [ceil(V/32)] mask of the next sampled token, or None when nothing constrains the output.

        The row is this session's own buffer, valid until the next call; draft columns come from
        `grammar.fill_bitmask`.
        """
        grammar = self._state.grammar
        if grammar is None or self.terminal:
            return None
        if self._mask is None:
            self._mask = grammar.allocate(1)
        grammar.fill_next(self._mask)
        return self._mask[0]

    def draft_masks(self) -> DraftMasks | None:
        """With a speculative backend: the committed grammar's rows for a block of drafts
        (`GrammarState.fill_bitmask`), and while a thinking budget runs, the block bound that ends at it (the forced
        `</think>` then comes where a plain run forces it). None when nothing constrains the output."""
        grammar, st, budget = self._state.grammar, self._state, self.options.thinking_budget
        if self.terminal:
            return None
        bound = None
        if budget is not None and not st.forced_suffix and st.parser.phase == REASONING and self._suffix:
            bound = max(1, budget - st.reasoning_tokens)
        fill = None
        if grammar is not None:
            def fill(drafts):
                out = grammar.allocate(len(drafts) + 1)
                grammar.fill_bitmask(drafts, out)
                return out
        return None if fill is None and bound is None else DraftMasks(fill, bound)

    @property
    def ending_token_ids(self) -> tuple[int, ...]:
        """Every token id that would end this output: its stop ids and, under a grammar, the grammar's stop tokens
        (which end it even with ignore_eos). The sampler must block all of them until min_tokens."""
        grammar_stops = EOS_TOKEN_IDS if self._state.grammar is not None else ()
        return tuple(dict.fromkeys(self.options.stop_token_ids + grammar_stops))

    @property
    def terminal(self) -> bool:
        return self._finish is not None

    @property
    def generated(self) -> int:
        return self._state.generated

    def preview(self, tokens: Sequence[int], *, forced: bool = False) -> OutputPreview:
        if self.terminal:
            raise EngineFailure("OutputSession.preview after the output ended")
        if not tokens:
            raise EngineFailure("OutputSession.preview of an empty row")
        st = self._state.fork()
        delta = _Delta([], Parsed(), [])
        finish, reason = self._run(st, tokens, forced, delta)
        if finish is not None:
            self._finalize(st, delta, released_tail=not isinstance(reason, str))
            if delta.parsed.cut_call:
                finish = FinishReason.LENGTH  # a constrained call cut short (max_tokens or a stop string)
            elif finish is FinishReason.STOP and (self._calls or delta.calls):
                finish = FinishReason.TOOL_CALLS
        boundary = len(delta.tokens) if reason == Qwen35Tokenizer.IM_END and self._reproduced(delta) else None
        base = len(self._calls)
        chunk = OutputChunk(tuple(delta.tokens), delta.parsed.content, delta.parsed.reasoning,
                            tuple(d for j, c in enumerate(delta.calls) for d in c.deltas(base + j)))
        needs_control = finish is None and self._control_for(st) is not None
        return OutputPreview(len(delta.tokens), finish is not None, finish, boundary, chunk, forced, self._version,
                             (st, delta, finish, reason), needs_control)

    def _reproduced(self, delta: _Delta) -> bool:
        """The whole output, ending with <|im_end|> in `delta`, is what the next turn's history renders."""
        if self._history is None:
            return False
        content = "".join(self._content) + delta.parsed.content
        reasoning = "".join(self._reasoning) + delta.parsed.reasoning
        return self._history.reproduces(self._tokens + delta.tokens, content, reasoning, self._calls + delta.calls)

    def _run(self, st: _State, tokens: Sequence[int], forced: bool, delta: _Delta):
        opts = self.options
        for tok in tokens:
            tok = int(tok)
            n = st.generated + 1
            if st.grammar is not None and not st.grammar.accept(tok):
                raise EngineFailure(f"output token {tok} at position {n} violates the request's grammar")
            st.generated = n
            delta.tokens.append(tok)
            if st.parser.phase == REASONING:
                st.reasoning_tokens += 1
            stops_apply = n > opts.min_tokens and not forced
            # A grammar that took a stop token has ended, whatever the request's own stop ids (ignore_eos).
            if (stops_apply and tok in opts.stop_token_ids) or (st.grammar is not None and st.grammar.terminated):
                return FinishReason.STOP, tok
            released = st.stops.push(st.detok.push(tok), check=stops_apply)
            self._parse(st, released, delta)
            if st.stops.matched is not None:
                return FinishReason.STOP, st.stops.matched
            if not forced and opts.max_tokens is not None and n >= opts.max_tokens:
                return FinishReason.LENGTH, None
        if forced:
            # A forced suffix is committed whole (control_suffix only offers one that fits in max_tokens).
            st.forced_suffix = True
            if opts.max_tokens is not None and st.generated >= opts.max_tokens:
                return FinishReason.LENGTH, None
        return None, None

    def _parse(self, st: _State, text: str, delta: _Delta) -> None:
        self._merge(delta, st.parser.push(text) if text else Parsed())

    def _merge(self, delta: _Delta, p: Parsed) -> None:
        delta.parsed.reasoning += p.reasoning
        delta.parsed.content += p.content
        delta.parsed.issues.extend(p.issues)
        delta.parsed.cut_call = delta.parsed.cut_call or p.cut_call
        delta.calls.extend(p.calls)

    def _finalize(self, st: _State, delta: _Delta, released_tail: bool) -> None:
        """End of output: release what was held (unless a stop string cut it) and close the channels."""
        if released_tail:
            self._parse(st, st.stops.flush() + st.detok.flush(), delta)
        self._merge(delta, st.parser.finish())

    def commit(self, preview: OutputPreview) -> OutputChunk:
        """Adopt the preview's fork; the returned chunk may now be published."""
        if preview.base_version != self._version:
            raise EngineFailure(f"stale OutputPreview (made at version {preview.base_version}, "
                                f"session at {self._version})")
        st, delta, finish, reason = preview.state
        self._state = st
        self._version += 1
        self._tokens.extend(delta.tokens)
        self._content.append(delta.parsed.content)
        self._reasoning.append(delta.parsed.reasoning)
        self._calls.extend(delta.calls)
        self._issues.extend(delta.parsed.issues)
        if finish is not None:
            self._finish, self._stop_reason = finish, reason
        return preview.chunk

    def end(self, reason: FinishReason) -> OutputChunk | None:
        """End the output early (deadline, cancellation): flush held-back text, close the channels, keep `reason`.
        Returns the chunk of what was held back, or None when nothing was."""
        if self.terminal:
            raise EngineFailure(f"OutputSession.end({reason.value}) after the output ended")
        st = self._state.fork()
        delta = _Delta([], Parsed(), [])
        self._finalize(st, delta, released_tail=True)
        base = len(self._calls)
        chunk = OutputChunk((), delta.parsed.content, delta.parsed.reasoning,
                            tuple(d for j, c in enumerate(delta.calls) for d in c.deltas(base + j)))
        self.commit(OutputPreview(0, True, reason, None, chunk, False, self._version, (st, delta, reason, None)))
        return chunk if chunk.text or chunk.reasoning_text or chunk.tool_calls else None

    def control_suffix(self) -> tuple[int, ...] | None:
        """The forced `</think>` suffix once the thinking budget is spent, else None."""
        return None if self.terminal else self._control_for(self._state)

    def _control_for(self, st: _State) -> tuple[int, ...] | None:
        budget = self.options.thinking_budget
        if budget is None or st.forced_suffix or st.parser.phase != REASONING:
            return None
        room = self.options.max_tokens is None or st.generated + len(self._suffix) <= self.options.max_tokens
        return self._suffix if self._suffix and room and st.reasoning_tokens >= budget else None

    def result(self) -> OutputResult:
        if self._finish is None:
            raise EngineFailure("OutputSession.result before the output ended")
        return OutputResult("".join(self._content), "".join(self._reasoning), tuple(self._calls), self._finish,
                            len(self._tokens), self._state.reasoning_tokens, tuple(self._tokens),
                            self._stop_reason, tuple(self._issues))

    def check_invariants(self) -> None:
        st = self._state
        if st.generated != len(self._tokens):
            raise AssertionError(f"session counted {st.generated} tokens but holds {len(self._tokens)}")
        if not 0 <= st.reasoning_tokens <= st.generated:
            raise AssertionError(f"reasoning_tokens {st.reasoning_tokens} outside 0..{st.generated}")
        if st.grammar is not None and st.grammar.accepted_tokens != st.generated:
            raise AssertionError(f"grammar advanced {st.grammar.accepted_tokens} tokens, output {st.generated}")
        if self.options.max_tokens is not None and st.generated > self.options.max_tokens:
            raise AssertionError(f"{st.generated} tokens exceed max_tokens={self.options.max_tokens}")
