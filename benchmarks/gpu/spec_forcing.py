"""bench_spec.py's instruments on a Program's executor: `Phases` times each phase of a speculative round (draft,
verify, accept, the replay of a cut block, and the Program's commit around it) between device syncs, and
`ForcedContinuation` forces every round to emit a chosen number of tokens by replacing the backend's drafts with
the target's own greedy continuation, a wrong token at the chosen index (random weights make real drafts
meaningless).
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import time

import torch

from ninfer.fast.hostcopy import to_device


class Phases:
    """Wall time of the executor's round phases (draft, verify, accept: the device acceptance queued, where the
    executor has it; replay: the feed of a cut block) and of the Program's commit (which holds the replay, a cut
    block's step-slot copy and the penalties' history), each bracketed by device syncs so the time is the phase's
    own. The host share of a round is what the Engine's step interval leaves: scheduling, the Frontend's work, index
    building. The syncs serialize what a served round overlaps (and a round launched ahead), so rows whose speed
    counts run with the phases off (`enabled`)."""

    NAMES = ("draft", "verify", "accept", "feed", "commit")

    def __init__(self, program, device: str):
        ex, self.device = program.executor, device
        self.seconds = {}
        # off: the phases run as served, no syncs between them (the timed rows); on: each phase bracketed
        self.enabled = True
        for name in self.NAMES[:-1]:
            if hasattr(ex, name):
                setattr(ex, name, self._timed(name, getattr(ex, name)))
        program.commit = self._timed("commit", program.commit)  # the Engine looks it up on the instance
        self.reset()

    def reset(self) -> None:
        self.seconds = {name: 0.0 for name in self.NAMES}
        self.rounds = 0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _timed(self, name: str, call):
        def run(*args):
            if not self.enabled:
                self.rounds += name == "draft"
                return call(*args)
            self._sync()
            t = time.perf_counter()
            out = call(*args)
            self._sync()
            self.seconds[name] += time.perf_counter() - t
            self.rounds += name == "draft"
            return out
        return run

    def per_round_ms(self) -> dict:
        n = max(self.rounds, 1)
        return {f"{'replay' if name == 'feed' else name}_ms": self.seconds[name] * 1e3 / n for name in self.NAMES}


@contextlib.contextmanager
def host_profile(into: dict, rounds: Phases, top: int = 25):
    """cProfile over the block (the caller may disable the yielded profiler and enable it later), its `top`
    functions by own time written to ``into["top"]`` per round of `rounds` (a diagnostic run apart from the timed
    ones: the profiler slows the host's Python)."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield prof
    finally:
        prof.disable()
        n = max(rounds.rounds, 1)
        stats = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
        into["rounds"] = n
        into["top"] = [{"function": f"{path.rsplit('/', 1)[-1]}:{line}({name})", "calls": calls / n,
                        "own_ms": own * 1e3 / n, "cumulative_ms": cum * 1e3 / n}
                       for (path, line, name), (calls, _, own, cum, _) in stats]


class ForcedContinuation:
    """The backend's draft, run and then overridden by the target's precomputed greedy continuation with a wrong
    token at index `accept` (every row then emits accept + 1 tokens). The verify logits of a block are pinned at the
    continuation's tokens up to the first wrong draft (one logit per position set to PIN, O(1)): a bf16 verify pass
    may pick another argmax than the plain step at a near-tie, which would derail the forced pattern, and acceptance
    still runs on those logits. Rows whose committed outputs left the continuation anyway keep the backend's drafts
    and count as diverged."""

    PIN = 1e4

    def __init__(self, program, continuations: dict[tuple[int, ...], list[int]], vocab: int, device: str):
        ex = program.executor
        self.real_draft, self.real_verify = ex.draft, ex.verify
        self.continuations, self.vocab, self.device = continuations, vocab, device
        self.reset(0)
        ex.draft, ex.verify = self.draft, self.verify

    def reset(self, accept: int) -> None:
        self.accept, self.followed, self.diverged = accept, 0, 0

    def _continuation(self, seq, need: int) -> list[int] | None:
        """The continuation after the committed outputs (`need` tokens of it), None once the row left it."""
        cont, n = self.continuations.get(tuple(seq.prompt)), seq.num_outputs
        if cont is None or len(cont) < n + need or seq.outputs != cont[:n]:
            return None
        return cont[n:n + need]

    def draft(self, seqs, ctxs, ks):
        real = self.real_draft(seqs, ctxs, ks)
        return [self._forced(seq, k, real, b) for b, (seq, k) in enumerate(zip(seqs, ks))]

    def _forced(self, seq, k: int, real, b: int):
        if not k:
            return (), []
        ahead = self._continuation(seq, k)
        if ahead is None:
            self.diverged += 1
            return real[b]  # the backend's own drafts (a device block reads them back here)
        self.followed += 1
        drafts = list(ahead)
        if self.accept < k:
            drafts[self.accept] = (drafts[self.accept] + 1) % self.vocab
        return tuple(drafts), [None] * k  # greedy rows: acceptance needs no q

    def verify(self, seqs, feds):
        out = self.real_verify(seqs, feds)
        for seq, logits in zip(seqs, out):  # logits [len(fed), V]: row i predicts output n + i
            last = min(self.accept, logits.shape[0] - 1)  # the first wrong draft's row, or the bonus row
            ahead = self._continuation(seq, last + 1)
            if ahead is not None:  # one indexed write per row, no host read
                logits[torch.arange(len(ahead), device=logits.device),
                       to_device(ahead, logits.device, torch.long)] = self.PIN
        return out
