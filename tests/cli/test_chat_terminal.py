"""`ninfer chat` in a real terminal (tmux where installed, and always a pseudo-terminal): an unknown /command gets
the list of commands and never reaches the model, Ctrl-C stops the reply and not the session, /exit leaves."""

from __future__ import annotations

import os
import sys

import pytest
from terminal_driver import drivers, open_terminal

CHAT = [sys.executable, "-m", "ninfer.cli", "chat", "--no-progress", "--max-num-seqs", "1", "--max-model-len", "4096",
        "-n", "4000"]


@pytest.mark.parametrize("kind", drivers())
def test_chat_commands_and_ctrl_c_in_a_terminal(kind, default_model):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TERM": "xterm"}
    term = open_terminal(kind, CHAT, env)
    try:
        term.wait_for(r"ready: .*\n(.|\n)*>>> $|>>> ", timeout=180)
        term.type("/nope")
        # the next prompt must be drawn before typing: typed ahead, the terminal echoes "hello" before ">>> "
        screen = term.wait_for(r"unknown command /nope; Commands: /think[\s\S]*>>> ")
        assert "prompt tokens" not in screen  # not sent to the model
        term.type("hello")
        # the reply is streaming: reasoning under its label, or content at once when the sampled reply closes
        # its reasoning at the first token
        term.wait_for(r">>> hello\n[\s\S]*\S")
        term.ctrl_c()
        screen = term.wait_for(r"\[interrupted\]\n\[\d+ prompt tokens, \d+ generated, finish=cancelled[^\n]*\n>>> ")
        generated = int(screen.split("[interrupted]")[1].split(" generated")[0].split(", ")[-1])
        assert 0 < generated < 4000
        term.type("/think")
        term.wait_for(r"thinking on")
        term.type("/exit")
        assert term.exit_status() == 0
    finally:
        term.close()
