"""The Frontend: prompt preparation and per-request output sessions for the Qwen3.5 family.

It owns the tokenizer, the chat template (the checkpoint's own Jinja template when the artifact carries one,
the built-in renderer otherwise), the grammar compiler and the context contract. Every request-level refusal
(unrepresentable conversation, schema, tool choice; a prompt beyond the context) is a RequestRejected raised
here, before the Engine admits anything.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ninfer.contracts import RejectReason, RequestRejected

from .budget import thinking_budget
from .detokenizer import TokenTable
from .grammar.options import StructuredOutputOptions
from .input_bounds import check_text
from .history import ASSISTANT_HEADER, history_check
from .instruction import format_instruction, with_instruction
from .jinja_template import JinjaChatTemplate
from .messages import TEXT_ONLY, ImageSink, normalize_chat, reject
from .outputs import OutputOptions
from .prompt import PreparedPrompt, char_to_token_boundaries, prepare_ids
from .render import RenderedChat, render_qwen35
from .session import OutputSession
from .tokenizer import Qwen35Tokenizer
from .vision_prompt import VisionPrompt

if TYPE_CHECKING:
    from .grammar.compiler import GrammarCompiler

FORCED_THINK_END = "\n</think>\n\n"


@dataclass(frozen=True)
class ChatRequest:
    """An OpenAI-shaped chat request, as the Gateway hands it over."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: Any = None
    response_format: Any = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: Mapping[str, Any] | None = None
    add_generation_prompt: bool = True
    json_whitespace: str = "compact"  # the final JSON's layout: compact or pretty (grammar/compose.py)
    # Caller message indices after which a cache boundary goes; None: the system turn and every message.
    cache_boundaries: Sequence[int] | None = None


@dataclass(frozen=True)
class PreparedChat:
    prompt: PreparedPrompt
    structured: StructuredOutputOptions


class Frontend:
    def __init__(self, tokenizer: Qwen35Tokenizer, *, max_context: int, chat_template: str | None = None,
                 grammar: GrammarCompiler | None = None, grammar_compile_timeout: float | None = None,
                 vision: VisionPrompt | None = None, no_vision: str = TEXT_ONLY):
        """`vision`: the image path when the Program prepared the Vision feature; without it image parts are
        refused with `no_vision` as the reason."""
        self.tokenizer = tokenizer
        self.vision, self.no_vision = vision, no_vision
        self.max_context = max_context
        self.template = JinjaChatTemplate(chat_template) if chat_template else None
        self.table = TokenTable.build(tokenizer)
        self.max_token_bytes = self.table.max_piece_bytes  # what bounds a text's token count from below
        self._grammar = grammar
        self._compile_timeout = grammar_compile_timeout
        self._grammar_lock = threading.Lock()  # Gateway threads may open the first structured sessions at once
        self.think_end_suffix = tuple(tokenizer.encode(FORCED_THINK_END))

    @property
    def grammar(self) -> GrammarCompiler:
        """Built on first structured request: the 248k-entry TokenizerInfo takes a few seconds."""
        with self._grammar_lock:
            if self._grammar is None:
                from .grammar.compiler import GrammarCompiler
                self._grammar = GrammarCompiler(self.tokenizer, compile_timeout=self._compile_timeout)
            return self._grammar

    def close(self) -> None:
        """Stop the grammar compiler's worker processes, if any were started."""
        with self._grammar_lock:
            if self._grammar is not None:
                self._grammar.close()

    def prepare_chat(self, request: ChatRequest, *, max_tokens: int | None = None) -> PreparedChat:
        # Every message renders at least its role marker token: more messages than the context holds cannot fit,
        # and that is known before rendering, tokenizing and hashing them.
        if len(request.messages) > self.max_context:
            raise RequestRejected(RejectReason.CONTEXT_TOO_LONG, f"{len(request.messages)} messages cannot fit "
                                  f"in the context of {self.max_context} tokens")
        kwargs = dict(request.chat_template_kwargs or {})
        sink = ImageSink(None if self.vision else self.no_vision, bool(kwargs.get("add_vision_id")))
        chat = normalize_chat(request.messages, request.tools, sink)
        images = self.vision.process(sink.images) if sink.images else []
        structured = StructuredOutputOptions.create(response_format=request.response_format, tools=chat.specs,
                                                    tool_choice=request.tool_choice,
                                                    parallel_tool_calls=request.parallel_tool_calls,
                                                    json_whitespace=request.json_whitespace)
        messages, shift = with_instruction(chat.messages, format_instruction(structured))
        text, rendered = self._render(messages, chat.tools, request.add_generation_prompt, kwargs)
        check_text(text, "the rendered chat prompt (tools or chat_template_kwargs)")
        wanted = self._boundary_chars(rendered, request.cache_boundaries, shift, len(chat.messages))
        self.check_text_fits(text, max_tokens)
        before = _before_reasoning(text)
        if request.cache_boundaries is None and request.add_generation_prompt and 0 < before < len(text):
            wanted.append(before)
        encoding = self.tokenizer.encoding(text)
        ids, bounds, media = encoding.ids, char_to_token_boundaries(encoding.offsets, wanted), None
        if images:
            ids, bounds, media = self.vision.expand(ids, bounds, images)
        # An output's prefix-execution boundary is checked by re-tokenizing history text, which has no images.
        exact = rendered is not None and rendered.text == text and rendered.builtin and media is None
        prompt = prepare_ids(ids, bounds, reasoning_open=_opens_think(text), text=text,
                             renders_history=exact and request.add_generation_prompt, media=media)
        self.check_context(len(prompt), max_tokens)
        return PreparedChat(prompt, structured)

    def _render(self, messages: Sequence[dict], tools: Sequence[dict], add_generation_prompt: bool,
                kwargs: dict) -> tuple[str, RenderedChat | None]:
        """The prompt text, and the built-in rendering when it is byte-identical (it knows where messages end)."""
        builtin = render_qwen35(messages, tools, add_generation_prompt=add_generation_prompt,
                                enable_thinking=kwargs.get("enable_thinking", True))
        if self.template is None:
            return builtin.text, builtin
        text = self.template.render(messages, tools, add_generation_prompt=add_generation_prompt,
                                    template_kwargs=kwargs)
        if text == builtin.text:
            return text, builtin
        return text, self._prefix_rendering(text, messages, tools, kwargs)

    def _prefix_rendering(self, text: str, messages: Sequence[dict], tools: Sequence[dict],
                          kwargs: dict) -> RenderedChat:
        """Message ends of a foreign template: where rendering messages[:i+1] is a prefix of the full text."""
        ends = []
        for i in range(len(messages)):
            try:
                head = self.template.render(messages[:i + 1], tools, add_generation_prompt=False,
                                            template_kwargs=kwargs)
            except RequestRejected:
                head = ""
            ends.append(len(head) if head and text.startswith(head) else -1)
        return RenderedChat(text, 0, tuple(ends), _opens_think(text), builtin=False)

    @staticmethod
    def _boundary_chars(rendered: RenderedChat | None, wanted: Sequence[int] | None, shift: int,
                        count: int) -> list[int]:
        if rendered is None:
            return []
        if wanted is None:
            return [c for c in (rendered.header_end, *rendered.message_ends) if c > 0]
        out = []
        for i in wanted:
            if not isinstance(i, int) or not 0 <= i < count:
                raise reject(f"cache boundary {i!r} is not a message index in 0..{count - 1}")
            out.append(rendered.message_ends[i + shift])
        return [c for c in out if c > 0]

    def prepare_tokens(self, token_ids: Sequence[int], *, max_tokens: int | None = None) -> PreparedPrompt:
        """A raw token prompt (completions): one identity over all of it, no boundaries inside."""
        limit = self.tokenizer.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < limit), None)
        if bad is not None or not token_ids:
            raise reject(f"prompt token {bad!r} is not an id in 0..{limit - 1}" if token_ids else "empty prompt")
        prompt = prepare_ids(token_ids)
        self.check_context(len(prompt), max_tokens)
        return prompt

    def prepare_text(self, text: str, *, max_tokens: int | None = None) -> PreparedPrompt:
        if not isinstance(text, str) or not text:
            raise reject("prompt text must be a non-empty string")
        self.check_text_fits(text, max_tokens)
        check_text(text, "prompt")
        return self.prepare_tokens(self.tokenizer.encode(text), max_tokens=max_tokens)

    def check_text_fits(self, text: str, max_tokens: int | None) -> None:
        """Refuse, before tokenizing it, a text that has more tokens than the context leaves room for: no token
        spells more than `max_token_bytes` bytes, and each character is at least one byte."""
        room = self.max_context - (max_tokens if max_tokens is not None else 1)
        if len(text) > max(room, 0) * self.max_token_bytes:
            raise RequestRejected(RejectReason.CONTEXT_TOO_LONG, f"a text of {len(text)} characters has more than "
                                  f"{max(room, 0)} tokens and exceeds the context of {self.max_context} tokens")

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> None:
        need = prompt_tokens + (max_tokens if max_tokens is not None else 1)
        if need > self.max_context:
            extra = f" plus max_tokens={max_tokens}" if max_tokens is not None else " plus one output token"
            raise RequestRejected(RejectReason.CONTEXT_TOO_LONG, f"prompt of {prompt_tokens} tokens{extra} "
                                  f"exceeds the context of {self.max_context} tokens")

    def open_session(self, prompt: PreparedPrompt, options: OutputOptions,
                     structured: StructuredOutputOptions | None = None) -> OutputSession:
        """A request's OutputSession, with its grammar compiled (RequestRejected if it cannot be).

        max_tokens resolves to what the context leaves after the prompt (or less, if the request asked for
        less); the Engine's output budget for the request must be this same `session.options.max_tokens`.
        With thinking on and a forced tool call, the thinking budget is capped so that the call fits (budget.py).
        """
        room = self.max_context - len(prompt)
        if options.max_tokens is None or options.max_tokens > room:
            self.check_context(len(prompt), options.max_tokens)
            options = replace(options, max_tokens=room, min_tokens=min(options.min_tokens, room))
        budget = thinking_budget(options.thinking_budget, structured, reasoning_open=prompt.reasoning_open,
                                 max_tokens=options.max_tokens, suffix_tokens=len(self.think_end_suffix),
                                 tokenizer=self.tokenizer)
        options = replace(options, thinking_budget=budget)
        grammar = None
        if structured is not None:
            if not options.tools and structured.callable_tools:
                options = replace(options, tools=structured.callable_tools)
            if structured.constrained:
                grammar = self.grammar.new_state(structured, reasoning=prompt.reasoning_open)
        history = None
        if prompt.renders_history:
            history = history_check(prompt.token_ids, Qwen35Tokenizer.IM_START, self.tokenizer.encode)
        return OutputSession(options, self.table, reasoning_open=prompt.reasoning_open, grammar=grammar,
                             control_suffix=self.think_end_suffix, history=history)


def _before_reasoning(text: str) -> int:
    """Just after the generation prompt's `<|im_start|>assistant\n`: the deepest point the next turn's rendering
    shares with this prompt when it drops this turn's reasoning (or its empty think block)."""
    at = text.rfind(ASSISTANT_HEADER)
    return at + len(ASSISTANT_HEADER) if at >= 0 else 0


def _opens_think(text: str) -> bool:
    """Whether the text leaves a <think> block open in its last turn."""
    tail = text[text.rfind("<|im_start|>"):]
    return tail.rfind("<think>") > tail.rfind("</think>")
