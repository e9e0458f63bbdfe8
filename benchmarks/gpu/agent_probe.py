"""Where the agent benchmark's time goes besides the model calls: the wall time inside the host tier's copies
(demotion, promotion) and the prefill chunks the Scheduler sized, by verdict. Asked after the first H200 run, where
TTFT at 4 concurrent conversations was seconds (turn 1, 284 tokens: 5.1 s) against 147-781 ms at 1: the
candidates are synchronous device-to-host copies into freshly pinned host memory at every demotion (each waits for
the queued device work) and one-GDN-chunk FLOOR pieces while other conversations decode.

It wraps two module functions for the duration of a `with` block (the benchmark's own measurement; nothing in
ninfer calls this): `program_core.transitions.to_host` / `to_device` and `engine.units.prefill_chunk`.
"""

from __future__ import annotations

import time
from collections import Counter

from ninfer.engine import units
from ninfer.program_core import transitions


class Probe:
    def __init__(self) -> None:
        self.copy_s = {"to_host": 0.0, "to_device": 0.0}
        self.copies = Counter()
        self.chunks: Counter[str] = Counter()  # verdict -> pieces
        self.chunk_tokens: Counter[str] = Counter()  # verdict -> tokens
        self._saved: dict = {}

    def _timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.copy_s[name] += time.perf_counter() - t
                self.copies[name] += 1
        return wrapper

    def _chunk(self, fn):
        def wrapper(*args, **kwargs):
            chunk, verdict = fn(*args, **kwargs)
            self.chunks[verdict.value] += 1
            self.chunk_tokens[verdict.value] += chunk
            return chunk, verdict
        return wrapper

    def __enter__(self) -> "Probe":
        self._saved = {"to_host": transitions.to_host, "to_device": transitions.to_device,
                       "prefill_chunk": units.prefill_chunk}
        transitions.to_host = self._timed("to_host", transitions.to_host)
        transitions.to_device = self._timed("to_device", transitions.to_device)
        units.prefill_chunk = self._chunk(units.prefill_chunk)
        return self

    def __exit__(self, *exc) -> None:
        transitions.to_host, transitions.to_device = self._saved["to_host"], self._saved["to_device"]
        units.prefill_chunk = self._saved["prefill_chunk"]

    def report(self) -> dict:
        return {"copy_s": dict(self.copy_s), "copies": dict(self.copies), "chunks": dict(self.chunks),
                "chunk_tokens": dict(self.chunk_tokens)}

    @staticmethod
    def format(r: dict) -> str:
        copies = ", ".join(f"{k} {r['copies'].get(k, 0)} in {v:.2f} s" for k, v in r["copy_s"].items())
        chunks = ", ".join(f"{k} {n} pieces / {r['chunk_tokens'][k]} tokens" for k, n in sorted(r["chunks"].items()))
        return f"host copies: {copies}; prefill chunks: {chunks or 'none sized'}"
