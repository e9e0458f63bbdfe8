"""Grammar compiles in killable worker processes: a compile past its timeout is ended by killing its process.

XGrammar cannot interrupt a compile, and some schemas of a few dozen KiB compile for minutes (40 `anyOf` branches of
20 patterned properties, 42 KB: ~2 minutes on one core). A thread that timed out would keep that core until XGrammar
returned; a process is killed on the spot, its CPU time reclaimed, and a fresh one started in its place.

Each worker is a fresh interpreter (`python -m ninfer.frontend.grammar.workers FD`: no forked threads, locks or CUDA
state) holding one XGrammar compiler over the parent's TokenizerInfo, sent as XGrammar's JSON. It compiles one
structural tag (JSON) at a time and answers with the CompiledGrammar's JSON, which the parent deserializes against
its own TokenizerInfo. multiprocessing's spawn and forkserver contexts are not used: they re-run the parent's main
script in the child, which a script without a `__main__` guard turns into a failed start. A worker talks over one
end of a socket pair (a multiprocessing Connection) and exits when the parent's end closes. Workers start on first
use; the time one takes to start (importing XGrammar, ~2 s) is bounded by BOOT_TIMEOUT_S, not by the compile timeout.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import Connection

BOOT_TIMEOUT_S = 120.0  # a worker that is not ready by then is killed; the request gets its error
CANCEL_POLL_S = 0.1  # how often a cancellable compile looks at its cancel event
_scope = threading.local()
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The host is out of processes, memory or descriptors for now: the same spawn may well work a moment later.
_TRANSIENT = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


class CompileTimeout(Exception):
    """The compile ran past its timeout; its worker was killed."""


class WorkerLost(Exception):
    """The worker ended (killed, crashed, or never started) before it answered; the message says how."""


class WorkerStartFailed(Exception):
    """No worker process could be made ready: the host refused its socket pair or its spawn (an OSError), or it
    ended or stalled before it was ready (no grammar had been sent to it yet). `transient`: it is out of processes,
    memory or descriptors for now, or the process died or stalled while starting (a retry starts a fresh one);
    otherwise the compiler cannot start at all (no interpreter, no permission). The message is the OS's and may
    name server paths: it is for the log, not for a client."""

    def __init__(self, error: OSError | str):
        super().__init__(f"the grammar compiler process could not be started: {error}" if isinstance(error, OSError)
                         else error)
        self.transient = not isinstance(error, OSError) or error.errno in _TRANSIENT


class CompileFailed(Exception):
    """XGrammar refused the grammar inside the worker; the message is XGrammar's."""


class CompileCancelled(Exception):
    """The compile's cancel event was set (its client went away); its worker was killed."""


@contextmanager
def cancellable(event: threading.Event):
    """Compiles this thread starts inside the block end, their worker killed, once `event` is set (the Gateway's
    preparation pool sets it when the request's client leaves)."""
    _scope.event = event
    try:
        yield
    finally:
        _scope.event = None


def current_cancel() -> threading.Event | None:
    """The cancel event of the ``cancellable`` block this thread is in (None outside one): other slow steps of a
    preparation (the Gateway's remote image fetches) end on it too."""
    return getattr(_scope, "event", None)


def _serve(conn: Connection) -> None:
    """The worker's loop: compile each structural tag it receives until the parent closes its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the group; the parent decides
    import xgrammar as xgr

    info_json, threads = conn.recv()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(info_json), max_threads=threads,
                                   cache_enabled=False)  # the parent caches compiled grammars
    del info_json
    conn.send(("ready", os.getpid()))
    while True:
        try:
            tag = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away or closed the pool
        try:
            answer = ("ok", compiler.compile_structural_tag(tag).serialize_json())
        except Exception as e:  # noqa: BLE001 - XGrammar's refusal goes back as text; the worker stays usable
            answer = ("error", str(e))
        try:
            conn.send(answer)
        except OSError:
            return  # the parent went away while this compiled


class _Worker:
    def __init__(self, info_json: str, threads: int):
        try:
            mine, theirs = socket.socketpair()  # EMFILE/ENFILE first show here: it takes two descriptors
        except OSError as e:
            raise WorkerStartFailed(e) from e
        env = dict(os.environ)
        # the child imports this same ninfer tree, whatever the parent's sys.path was built from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())], env=env,
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as e:
            mine.close()
            raise WorkerStartFailed(e) from e
        finally:
            theirs.close()  # the child holds its own copy: the child's exit is EOF here
        self.conn = Connection(mine.detach())
        self._setup = (info_json, threads)  # sent on first use: the child imports XGrammar meanwhile
        self._sender: threading.Thread | None = None
        self.ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def compile(self, tag_json: str, timeout: float | None) -> str:
        """Raises WorkerStartFailed if the process never got ready, WorkerLost if it ended while compiling."""
        if not self.ready:
            self._await_ready()
        try:
            self.conn.send(tag_json)
            self._await_answer(timeout, current_cancel())
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerLost(self._ended()) from None
        if kind == "error":
            raise CompileFailed(payload)
        return payload

    def _await_answer(self, timeout: float | None, cancel: threading.Event | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            wait = left if cancel is None else (CANCEL_POLL_S if left is None else min(left, CANCEL_POLL_S))
            if self.conn.poll(wait):
                return
            if cancel is not None and cancel.is_set():
                raise CompileCancelled()
            if deadline is not None and time.monotonic() >= deadline:
                raise CompileTimeout()

    def _await_ready(self) -> None:
        """A process that ends or stalls before it is ready failed to start (the host's problem: it had no grammar
        yet), not a compile: WorkerStartFailed, so the request is told to retry, not to simplify its schema."""
        # The setup (the vocabulary, MBs) fills the socket until the child reads it: sent on a thread, so that a
        # child stalled before its first read is bounded by BOOT_TIMEOUT_S too (kill() ends the send with EPIPE).
        sender = threading.Thread(target=self._send_setup, args=(self._setup,), daemon=True,
                                  name="ninfer-grammar-setup")
        try:
            sender.start()
        except RuntimeError as e:  # the host refused a thread ("can't start new thread"): a failed start too
            raise WorkerStartFailed(f"the grammar compiler process could not be set up: {e}") from None
        self._sender = sender  # kill() joins it: only a started one
        try:
            if not self.conn.poll(BOOT_TIMEOUT_S):
                raise WorkerStartFailed(f"the grammar compiler process was not ready within {BOOT_TIMEOUT_S:g} s")
            self.conn.recv()
        except (EOFError, OSError):
            raise WorkerStartFailed(self._ended("was ready")) from None
        self._sender.join()  # the child read it all before it answered
        self.ready, self._setup = True, None

    def _send_setup(self, setup: tuple[str, int]) -> None:
        try:
            self.conn.send(setup)
        except OSError:
            pass  # the child ended: the waiting thread sees its EOF

    def _ended(self, before: str = "answered") -> str:
        try:
            code = self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        how = "is still running" if code is None else (f"was killed by signal {-code}" if code < 0
                                                       else f"exited with status {code}")
        return f"the grammar compiler process {how} before it {before}"

    def kill(self) -> None:
        """SIGKILL and reap: the compile's CPU time ends now, and no zombie stays."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self._sender is not None:
            self._sender.join()  # its send ends with the child's socket: only then may the descriptor close
        self.conn.close()


class CompilerWorkers:
    """A bounded pool of worker processes; `compile` blocks its caller's thread until an answer or the timeout.

    At most `workers` compiles run at once (a caller beyond them waits for a worker). A worker that timed out, died
    or was abandoned is killed and replaced at once, so that the next compile does not wait for a fresh one to start.
    """

    def __init__(self, info_json: str, *, workers: int = 2, threads: int = 1):
        self._info_json, self._threads = info_json, threads
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._closed = False

    def compile(self, tag_json: str, timeout: float | None) -> str:
        """The CompiledGrammar's JSON; raises CompileTimeout, CompileCancelled, WorkerLost, WorkerStartFailed or
        CompileFailed."""
        with self._slots:
            worker = self._take()
            try:
                result = worker.compile(tag_json, timeout)
            except CompileFailed:
                self._give_back(worker)  # XGrammar answered: the worker is fine
                raise
            except WorkerStartFailed:
                self._replace(worker, fresh=False)  # the host just failed a start: the next compile tries its own
                raise
            except BaseException:
                self._replace(worker)  # timed out, cancelled, died, or this thread was interrupted mid-compile
                raise
            self._give_back(worker)
            return result

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise WorkerLost("the grammar compiler is shut down")
            worker = self._idle.pop() if self._idle else None
        if worker is not None and worker.process.poll() is not None:
            worker.kill()  # it ended while idle (the OOM killer, an operator): reaped, and no request's failure
            worker = None
        if worker is None:
            worker = _Worker(self._info_json, self._threads)  # not under the lock: it forks a process
        with self._lock:
            self._busy.add(worker)
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)

    def _replace(self, worker: _Worker, fresh: bool = True) -> None:
        """Kill and drop `worker`; with `fresh`, start its successor now so the next compile does not wait."""
        worker.kill()
        with self._lock:
            self._busy.discard(worker)
            if self._closed or not fresh:
                return
        try:
            fresh = _Worker(self._info_json, self._threads)
        except WorkerStartFailed:
            return  # the caller's own outcome stands; the next compile tries to start one again
        with self._lock:
            if self._closed:
                fresh.kill()
            else:
                self._idle.append(fresh)

    def pids(self) -> dict[str, list[int]]:
        """The worker processes' ids, idle and busy (operators and tests look at them)."""
        with self._lock:
            return {"idle": [w.pid for w in self._idle], "busy": [w.pid for w in self._busy]}

    def close(self) -> None:
        """Kill every worker; a compile still running ends with WorkerLost (its thread reaps its worker)."""
        with self._lock:
            self._closed = True
            idle, busy, self._idle = self._idle, list(self._busy), []
        for w in idle:
            w.kill()
        for w in busy:
            w.process.kill()  # its pipe stays open for the thread reading it


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
