"""Split released output text into reasoning, content and tool calls, as it streams.

Phases: REASONING (the prompt opened <think>) until the first `</think>`, or until a `<tool_call>` when tools
are offered (an implicit end, as peers do); CONTENT after that (everything, when thinking is off); CALL from
`<tool_call>` to `</tool_call>`. Text that could still turn out to be a marker, and newlines the chat
template would trim around markers, are held back until decided, so no partial tag ever leaks as content.
A tool call is emitted once complete and valid; a malformed one falls back to content, verbatim, and is
reported. An unterminated one (the output was cut) falls back to content as well, except under a grammar
(`drop_unterminated`): there the text is a call by construction, so it is dropped rather than leaked as raw XML,
and the output counts as cut off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .messages import ToolSpec
from .tool_calls import MalformedToolCall, ToolCall, argument_fragments, parse_body

THINK_END = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
REASONING, CONTENT, CALL = "reasoning", "content", "call"


@dataclass
class Parsed:
    """What one push released."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    cut_call: bool = False  # the output ended inside a tool call that was dropped (drop_unterminated)


def _partial_marker(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:n]):
                best = n
                break
    return best


@dataclass
class ChannelParser:
    reasoning_open: bool
    tools: tuple[ToolSpec, ...]
    new_id: Callable[[int], str]
    phase: str = ""
    buf: str = ""
    strip_newlines: bool = False  # right after </think> or a tool call: the template drops these newlines
    calls: int = 0
    drop_unterminated: bool = False  # a grammar wrote the output: an unterminated call is dropped, not content

    def __post_init__(self) -> None:
        if not self.phase:
            self.phase = REASONING if self.reasoning_open else CONTENT

    def clone(self) -> "ChannelParser":
        twin = object.__new__(ChannelParser)  # every field is immutable: a copy of the instance dict suffices
        twin.__dict__.update(self.__dict__)
        return twin

    def push(self, text: str) -> Parsed:
        out = Parsed()
        self.buf += text
        while self._step(out):
            pass
        return out

    def _step(self, out: Parsed) -> bool:
        """Consume what can be decided; True when the phase changed and the rest needs another look."""
        if self.phase == CALL:
            return self._step_call(out)
        if self.strip_newlines:
            self.buf = self.buf.lstrip("\n")
            if not self.buf:
                return False
            self.strip_newlines = False
        markers = [CALL_OPEN] if self.tools else []
        if self.phase == REASONING:
            markers.append(THINK_END)
        hits = [(i, m) for m in markers if (i := self.buf.find(m)) >= 0]
        if hits:
            i, marker = min(hits)
            self._emit(out, self.buf[:i].rstrip("\n") if self.phase == REASONING else self.buf[:i].rstrip())
            self.buf = self.buf[i + len(marker):]
            self.phase = CALL if marker == CALL_OPEN else CONTENT
            self.strip_newlines = marker == THINK_END
            return True
        keep = _partial_marker(self.buf, markers)
        head = self.buf[:len(self.buf) - keep]
        # Newlines (and, before a tool call, any whitespace) the template trims stay held until decided.
        trimmed = head.rstrip("\n") if self.phase == REASONING else (head.rstrip() if self.tools else head)
        self._emit(out, trimmed)
        self.buf = self.buf[len(trimmed):]
        return False

    def _step_call(self, out: Parsed) -> bool:
        i = self.buf.find(CALL_CLOSE)
        if i < 0:
            return False
        body, self.buf = self.buf[:i], self.buf[i + len(CALL_CLOSE):]
        try:
            name, arguments = parse_body(body, self.tools)
        except MalformedToolCall as e:
            out.content += CALL_OPEN + body + CALL_CLOSE
            out.issues.append(f"malformed tool call kept as content: {e}")
        else:
            fragments = tuple(argument_fragments(arguments))
            out.calls.append(ToolCall(self.new_id(self.calls), name, "".join(fragments), fragments))
            self.calls += 1
        self.phase = CONTENT
        self.strip_newlines = True
        return True

    def _emit(self, out: Parsed, text: str) -> None:
        if self.phase == REASONING:
            out.reasoning += text
        else:
            out.content += text

    def finish(self) -> Parsed:
        """End of output: held text goes to its channel; an unterminated call falls back to content."""
        out = Parsed()
        held_call = self.phase == CONTENT and self.tools and self.buf.strip() and CALL_OPEN.startswith(
            self.buf.strip())
        if self.drop_unterminated and (self.phase == CALL or held_call):
            out.cut_call = True
            out.issues.append("unterminated tool call dropped: the output ended inside it")
        elif self.phase == CALL:
            out.content = CALL_OPEN + self.buf
            out.issues.append("unterminated tool call kept as content")
        elif self.phase == REASONING:
            out.reasoning = self.buf
        elif not self.strip_newlines:
            out.content = self.buf
        self.buf = ""
        return out
