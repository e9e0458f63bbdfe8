"""Drive an interactive command in a real terminal: tmux when it is installed, else a pseudo-terminal of our own.

Both give the command a controlling terminal, so Ctrl-C is a SIGINT from the terminal, exactly as a user's is. The
screen text is read back without colours; `wait_for` polls it until a pattern appears.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
import uuid

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")


class PtyTerminal:
    kind = "pty"

    def __init__(self, argv: list[str], env: dict[str, str]):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its stdin/stdout/stderr are the terminal
            # a fresh terminal's signal state, as tmux's server gives its panes: an ignored or blocked SIGINT survives
            # fork and exec, so whatever the test process inherited or set would otherwise swallow the Ctrl-C
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        self.buf = b""
        self.status: int | None = None

    def _pump(self, wait: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], wait)
        if ready:
            try:
                self.buf += os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                time.sleep(wait)

    def screen(self) -> str:
        self._pump(0)
        return ANSI.sub("", self.buf.decode("utf-8", "replace")).replace("\r", "")

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\r")

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.screen()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on the screen after {timeout} s:\n{self.screen()[-3000:]}")
            self._pump(0.1)
        return self.screen()

    def exit_status(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout} s:\n{self.screen()[-2000:]}")
            else:
                self._pump(0.1)
        return self.status

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


class TmuxTerminal:
    kind = "tmux"

    def __init__(self, argv: list[str], env: dict[str, str]):
        # A private tmux server (its own socket), so nothing else's sessions are touched.
        self.socket, self.name = f"ninfer-test-{uuid.uuid4().hex[:8]}", "chat"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("NINFER", "PYTHON",
                                                                                              "OMP", "PATH")))
        shell = f"env {exports} {shlex.join(argv)}; echo EXIT=$?; sleep 600"
        self._tmux("new-session", "-d", "-s", self.name, "-x", "200", "-y", "60", shell)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-t", self.name, "-S", "-5000")

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", self.name, "-l", line)
        self._tmux("send-keys", "-t", self.name, "Enter")

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", self.name, "C-c")

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, screen := self.screen()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on the screen after {timeout} s:\n{screen[-3000:]}")
            time.sleep(0.1)
        return screen

    def exit_status(self, timeout: float = 60) -> int:
        return int(re.search(r"EXIT=(\d+)", self.wait_for(r"EXIT=\d+", timeout)).group(1))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def drivers() -> list[str]:
    """tmux where it is installed (as a user runs it), and always our own pseudo-terminal."""
    return (["tmux"] if shutil.which("tmux") else []) + ["pty"]


def open_terminal(kind: str, argv: list[str], env: dict[str, str]):
    return (TmuxTerminal if kind == "tmux" else PtyTerminal)(argv, env)
