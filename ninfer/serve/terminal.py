"""The terminal front ends: `ninfer generate` (one prompt) and `ninfer chat` (interactive, with history).

Both stream through the public Engine path exactly as the HTTP server does. Reasoning goes to the terminal dimmed
and set apart from the answer, so a reader (or a pipe: only the answer reaches stdout) can tell them apart.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import click

from ninfer.contracts import GenerationResult, OutputDelta, RequestRejected
from ninfer.frontend import ChatRequest
from ninfer.sampling import SamplingParams
from ninfer.serve.submit import submit
from ninfer.wiring import Runtime


@dataclass
class Printer:
    """Writes reasoning dimmed to stderr and the answer to stdout, marking where each channel starts."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    channel: str | None = None

    def reasoning(self, text: str) -> None:
        if not text:
            return
        if self.channel != "reasoning":
            click.echo(click.style("[thinking] ", dim=True), nl=False, file=self.err)
            self.channel = "reasoning"
        click.echo(click.style(text, dim=True), nl=False, file=self.err)

    def content(self, text: str) -> None:
        if not text:
            return
        if self.channel == "reasoning":
            click.echo(click.style("\n[answer] ", dim=True), file=self.err, nl=False)
        self.channel = "content"
        click.echo(text, nl=False, file=self.out)

    def tool_calls(self, calls: Any) -> None:
        for call in calls:
            click.echo(f"\n[tool call {call.name}] {call.arguments}", file=self.out)


def stream(rt: Runtime, handle, printer: Printer) -> tuple[GenerationResult, float]:
    """Print each committed chunk as it arrives; returns the final result and the seconds to first token."""
    start, first = time.monotonic(), None
    result = None
    for ev in handle.events(timeout=600):
        if isinstance(ev, OutputDelta):
            first = first or time.monotonic() - start
            printer.reasoning(ev.delta.reasoning_text)
            printer.content(ev.delta.text)
        elif isinstance(ev, GenerationResult):
            result = ev
    assert result is not None
    if result.output is not None:
        printer.tool_calls(result.output.tool_calls)
    click.echo(file=printer.out)
    return result, first or 0.0


def stats_line(result: GenerationResult, ttft: float, seconds: float) -> str:
    n = result.usage.completion_tokens
    rate = (n - 1) / (seconds - ttft) if n > 1 and seconds > ttft else 0.0
    cached = f", {result.usage.cached_prompt_tokens} cached" if result.usage.cached_prompt_tokens else ""
    return (f"[{result.usage.prompt_tokens} prompt tokens{cached}, {n} generated, finish={result.finish_reason.value}"
            f", TTFT {ttft * 1000:.0f} ms, {rate:.1f} tok/s]")


def run_turn(rt: Runtime, messages: list[dict], sampling: SamplingParams, template_kwargs: dict,
             printer: Printer, raw: str | None = None) -> GenerationResult:
    """One generation: a chat turn over `messages`, or `raw` text fed as is."""
    fe = rt.frontend
    start = time.monotonic()
    if raw is not None:
        prompt, structured = fe.prepare_text(raw, max_tokens=sampling.max_tokens), None
    else:
        kwargs = {**rt.options.default_chat_template_kwargs, **template_kwargs}
        chat = fe.prepare_chat(ChatRequest(messages, chat_template_kwargs=kwargs), max_tokens=sampling.max_tokens)
        prompt, structured = chat.prompt, chat.structured
    result, ttft = stream(rt, submit(rt, prompt, sampling, structured=structured), printer)
    if result.error:
        raise click.ClickException(f"generation failed: {result.error}")
    click.echo(click.style(stats_line(result, ttft, time.monotonic() - start), dim=True), err=True)
    return result


def chat_loop(rt: Runtime, sampling: SamplingParams, think: bool, read: Callable[[str], str] = input,
              printer: Printer | None = None) -> None:
    """Read user turns until EOF or /exit; /think and /no_think switch thinking, /reset clears the history."""
    printer = printer or Printer()
    history: list[dict] = []
    click.echo("Commands: /think, /no_think, /reset, /exit. " + ("Thinking on." if think else "Thinking off."),
               err=True)
    while True:
        try:
            line = read(">>> ").strip()
        except EOFError:
            return
        if not line:
            continue
        if line in ("/exit", "/quit", "/bye"):
            return
        if line in ("/think", "/no_think"):
            think = line == "/think"
            click.echo(f"thinking {'on' if think else 'off'}", err=True)
            continue
        if line == "/reset":
            history.clear()
            continue
        history.append({"role": "user", "content": line})
        printer.channel = None
        try:
            result = run_turn(rt, history, sampling, {"enable_thinking": think}, printer)
        except RequestRejected as e:
            history.pop()
            click.echo(f"refused: {e.message}", err=True)
            continue
        out = result.output
        turn = {"role": "assistant", "content": out.content, "reasoning_content": out.reasoning}
        if out.tool_calls:
            turn["tool_calls"] = [c.as_openai() for c in out.tool_calls]
        history.append(turn)
