"""`ninfer chat`: read user turns, run each through terminal.run_turn, keep the conversation.

A line whose first word is `/` and a name (`/think`, `/reset`, ...) is a command; an unknown one gets the list of
commands and is never sent to the model (a line like `/usr/bin is where?` is a message: its first word holds
another `/`). Ctrl-C while the model writes stops that reply (cancelled at the Engine's next boundary, its text so
far kept in the history); Ctrl-C at the prompt says how to leave; Ctrl-D or /exit ends the session.
"""

from __future__ import annotations

import re
from typing import Callable

import click

from ninfer.contracts import RequestRejected
from ninfer.runtime import Runtime
from ninfer.sampling import SamplingParams

from .terminal import Printer, run_turn

COMMANDS = {"/think": "thinking on", "/no_think": "thinking off", "/reset": "forget the conversation",
            "/exit": "leave (also /quit, /bye, Ctrl-D)", "/help": "this list"}
EXITS = ("/exit", "/quit", "/bye")
COMMAND_WORD = re.compile(r"/[A-Za-z_?]+")


def help_text() -> str:
    return "Commands: " + ", ".join(f"{c} ({what})" for c, what in COMMANDS.items()) + ". Ctrl-C stops a reply."


def command_of(line: str) -> str | None:
    """The command a line names, or None when it is a message."""
    word = line.split(maxsplit=1)[0] if line else ""
    return word if COMMAND_WORD.fullmatch(word) else None


def chat_loop(rt: Runtime, sampling: SamplingParams, think: bool, read: Callable[[str], str] = input,
              printer: Printer | None = None) -> None:
    """Read user turns until EOF or /exit."""
    printer = printer or Printer()
    history: list[dict] = []
    click.echo(help_text() + (" Thinking on." if think else " Thinking off."), err=True)
    while True:
        try:
            line = read(">>> ").strip()
        except EOFError:
            return
        except KeyboardInterrupt:
            click.echo("\n(Ctrl-D or /exit leaves the chat)", err=True)
            continue
        command = command_of(line)
        if not line:
            continue
        if command in EXITS:
            return
        if command in ("/think", "/no_think"):
            think = command == "/think"
            click.echo(f"thinking {'on' if think else 'off'}", err=True)
        elif command == "/reset":
            history.clear()
            click.echo("conversation cleared", err=True)
        elif command is not None:
            known = command in COMMANDS
            click.echo(help_text() if known else f"unknown command {command}; {help_text()}", err=True)
        else:
            _turn(rt, history, line, sampling, think, printer)


def _turn(rt: Runtime, history: list[dict], line: str, sampling: SamplingParams, think: bool,
          printer: Printer) -> None:
    history.append({"role": "user", "content": line})
    printer.channel = None
    try:
        result, _ = run_turn(rt, history, sampling, {"enable_thinking": think}, printer)
    except RequestRejected as e:
        history.pop()
        click.echo(f"refused: {e.message}", err=True)
        return
    out = result.output
    if out is None:
        history.pop()  # nothing came back (an interruption before the first token)
        return
    turn = {"role": "assistant", "content": out.content, "reasoning_content": out.reasoning}
    if out.tool_calls:
        turn["tool_calls"] = [c.as_openai() for c in out.tool_calls]
    history.append(turn)
