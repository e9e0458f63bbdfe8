"""The terminal front end of one turn: `ninfer generate`, and each turn of `ninfer chat` (chat_repl.py).

Both stream through the public Engine path exactly as the HTTP server does. Reasoning goes to stderr dimmed and set
apart from the answer, so a reader (or a pipe: only the answer reaches stdout) can tell them apart; click drops the
dimming where a stream is not a terminal, and the stats line always starts on a line of its own.

Sampling: a flag the user gave, else the model's generation_config defaults (`--generation-config`), else greedy.
Without `--max-tokens` a turn writes up to CLI_MAX_TOKENS tokens, fewer when the context leaves less room.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, TextIO

import click

from ninfer.contracts import GenerationResult, OutputDelta
from ninfer.frontend import ChatRequest
from ninfer.runtime import Runtime
from ninfer.sampling import SamplingParams
from ninfer.serve.submit import submit

CLI_MAX_TOKENS = 256
CLI_PLAIN = {"temperature": 0.0}  # what `--generation-config none` leaves: greedy decoding
CANCEL_WAIT_S = 60.0


def cli_sampling(rt: Runtime, flags: Mapping[str, Any]) -> SamplingParams:
    """The flags given (None: not given) over the model's sampling defaults over greedy."""
    return SamplingParams.create(**{**CLI_PLAIN, **rt.sampling_defaults.fill(flags)})


@dataclass
class Printer:
    """Writes reasoning dimmed to stderr and the answer to stdout, marking where each channel starts."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    channel: str | None = None
    _open: dict = field(default_factory=dict)  # stream -> whether its last text left a line unfinished

    def write(self, text: str, err: bool = False, **style: Any) -> None:
        if not text:
            return
        stream = self.err if err else self.out
        click.echo(click.style(text, **style) if style else text, nl=False, file=stream)
        self._open[id(stream)] = not text.endswith("\n")
        if self._shared_terminal():
            self._open[id(self.out if err else self.err)] = self._open[id(stream)]

    def _shared_terminal(self) -> bool:
        # Both on one terminal: the cursor is wherever the last write to either left it.
        return all(getattr(s, "isatty", lambda: False)() for s in (self.out, self.err))

    def end_line(self, err: bool = False) -> None:
        """Finish the stream's current line, if a write left one open."""
        if self._open.get(id(self.err if err else self.out)):
            self.write("\n", err=err)

    def reasoning(self, text: str) -> None:
        if not text:
            return
        if self.channel != "reasoning":
            self.write("[thinking] ", err=True, dim=True)
            self.channel = "reasoning"
        self.write(text, err=True, dim=True)

    def content(self, text: str) -> None:
        if not text:
            return
        if self.channel == "reasoning":
            self.end_line(err=True)
            self.write("[answer] ", err=True, dim=True)
        self.channel = "content"
        self.write(text)

    def tool_calls(self, calls: Any) -> None:
        for call in calls:
            self.end_line()
            self.write(f"[tool call {call.name}] {call.arguments}\n")

    def note(self, text: str) -> None:
        """A line of its own on stderr (the stats, an interruption)."""
        self.end_line(err=True)
        self.write(text + "\n", err=True, dim=True)


def stream(handle, printer: Printer) -> tuple[GenerationResult, float, bool]:
    """Print each committed chunk as it arrives; (final result, seconds to first token, interrupted).

    Ctrl-C cancels the request at the Engine's next boundary; the result then holds the output so far."""
    start, first = time.monotonic(), None
    result, interrupted = None, False
    events = handle.events(timeout=600)
    while result is None:
        try:
            for ev in events:
                if isinstance(ev, OutputDelta):
                    first = first or time.monotonic() - start
                    printer.reasoning(ev.delta.reasoning_text)
                    printer.content(ev.delta.text)
                elif isinstance(ev, GenerationResult):
                    result = ev
        except KeyboardInterrupt:
            interrupted = True
            handle.cancel()
            events = handle.events(timeout=CANCEL_WAIT_S)
    if result.output is not None:
        printer.tool_calls(result.output.tool_calls)
    printer.end_line()
    return result, first or 0.0, interrupted


def stats_line(result: GenerationResult, ttft: float, seconds: float) -> str:
    n = result.usage.completion_tokens
    rate = (n - 1) / (seconds - ttft) if n > 1 and seconds > ttft else 0.0
    cached = f", {result.usage.cached_prompt_tokens} cached" if result.usage.cached_prompt_tokens else ""
    return (f"[{result.usage.prompt_tokens} prompt tokens{cached}, {n} generated, finish={result.finish_reason.value}"
            f", TTFT {ttft * 1000:.0f} ms, {rate:.1f} tok/s]")


def run_turn(rt: Runtime, messages: list[dict], sampling: SamplingParams, template_kwargs: dict,
             printer: Printer, raw: str | None = None) -> tuple[GenerationResult, bool]:
    """One generation, a chat turn over `messages` or `raw` text fed as is; (result, interrupted by Ctrl-C)."""
    fe = rt.frontend
    start = time.monotonic()
    if raw is not None:
        prompt, structured = fe.prepare_text(raw, max_tokens=sampling.max_tokens), None
    else:
        kwargs = {**rt.options.default_chat_template_kwargs, **template_kwargs}
        chat = fe.prepare_chat(ChatRequest(messages, chat_template_kwargs=kwargs), max_tokens=sampling.max_tokens)
        prompt, structured = chat.prompt, chat.structured
    if sampling.max_tokens is None:
        # The default output budget shrinks to the room the context leaves (at least one token: checked above).
        room = min(CLI_MAX_TOKENS, rt.max_context - len(prompt))
        sampling = replace(sampling, max_tokens=room, min_tokens=min(sampling.min_tokens, room))
    handle = submit(rt, prompt, sampling, structured=structured, thinking_budget=rt.options.thinking_token_budget)
    result, ttft, interrupted = stream(handle, printer)
    if result.error and not interrupted:
        raise click.ClickException(f"generation failed: {result.error}")
    if interrupted:
        printer.note("[interrupted]")
    printer.note(stats_line(result, ttft, time.monotonic() - start))
    return result, interrupted
