"""Speculative decoding's machinery through the public Engine, with forced acceptance (issue 11's benchmark).

Random weights make the MTP head's drafts meaningless, so the drafts are replaced: per model, the Program without a
backend first decodes every prompt greedily (the autoregressive baseline, timed), and that continuation becomes the
drafts of the Program with the MTP backend (k = 3), with a wrong token injected at draft index L - 1 so every round
emits exactly L tokens (L = 1..k+1; ninfer.testing.speculation.ForcedDrafts does the same on the CPU from a
reference model). The backend's own draft still runs every round, so its cost stays in the step, and is timed on its
own. Per model and B = 1, 2, 4, 8: ms per round, emitted tokens per row and round, ms per token and tok/s for each
L, the issue's targets at 9B B = 1 with pass/fail, and tok/s projected at perf-anchors' acceptance lengths. Each
round is split into phases (`Phases`: draft, verify, accept on the device, replay of a cut block, each between
device syncs, and the host rest of the Engine's step interval), so a run tells which part of the round remains
(the fast MTP round replays nothing: a cut block takes its state from the verify pass's step slots, a slot copy in
the host share). On the fast Program the round's graphs are also timed on their own (`spec_graphs.py`: per B the
captured verify pass against the same body run eagerly, the B = 1 replay graph and, for MTP, the draft's graphs),
in the JSON as `round_graphs`; with DFlash the verify and replay graphs at each block's width (the drafter's
context extension inside).

`--method dflash` (or dflash2) runs issue 12's benchmark instead: a random drafter of the published geometry
(`shapes.published_drafter`: 5 layers at the target's hidden size, made on the device), blocks 8 and 16 (k = 7,
15) with forced lengths L in {1, 3, 5, (k+1)/2 + 1, k + 1}, the drafter pass timed on its own, and issue 12's
targets (block 16 at 9B, B = 1: the drafter pass <= 25% of an AR step and >= 6x AR tok/s at full acceptance; at
B = 8, every block: never below plain decode from L = 3) with pass/fail and projected tok/s.

Run: python benchmarks/gpu/bench_spec.py [--models 0.8B,9B,35B-A3B] [--deadline-s 230] [--out DIR]
     python benchmarks/gpu/bench_spec.py --method dflash --models 9B,35B-A3B
     python benchmarks/gpu/bench_spec.py --smoke [--program reference|fast] [--method dflash]   # tiny, CPU
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import Run, bench_arguments, close, free_device  # noqa: E402
from shapes import config, published_drafter, random_drafter_source, random_prompt, random_source  # noqa: E402
from spec_graphs import round_graph_times  # noqa: E402
from spec_report import DFLASH_ANCHORS, dflash_targets, print_table, projections, targets  # noqa: E402

from ninfer.contracts import GenerationResult, OutputDelta  # noqa: E402
from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.engine.records import GenerationRequest  # noqa: E402
from ninfer.fast.hostcopy import to_device  # noqa: E402
from ninfer.models.qwen3_5.params import MTP, TEXT  # noqa: E402
from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod  # noqa: E402
from ninfer.testing.sessions import TokenSession  # noqa: E402

LANES = 8


@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    kernels: str = "triton"
    program: str = "fast"
    method: str = "mtp"
    batches: tuple[int, ...] = (1, 2, 4, 8)
    k: int = 3  # MTP's drafts
    blocks: tuple[int, ...] = (16, 8)  # DFlash's block sizes (k = block - 1), the one the B = 1 targets name first
    prompt_len: int = 480
    steps: int = 10  # timed rounds per case
    warmup: bool = True  # untimed runs first (Triton compiles, cuBLAS plans); nothing to warm on the CPU
    max_context: int = 1024
    budget_bytes: int | None = None  # None: 90% of the free device memory


SMOKE = Settings(device="cpu", kernels="naive", program="reference", batches=(1, 2), prompt_len=12, steps=3,
                 warmup=False, max_context=96, budget_bytes=1 << 30)
MIN_SECONDS = {"0.8B": 30, "9B": 60, "35B-A3B": 90, "tiny": 1}


def lengths(s: Settings, k: int) -> list[int]:
    """The forced acceptance lengths timed at k drafts: all for MTP, a spread for a DFlash block."""
    if s.method == "mtp":
        return list(range(1, k + 2))
    return sorted({1, 3, 5, (k + 1) // 2 + 1, k + 1})


def ks(s: Settings) -> list[int]:
    return [s.k] if s.method == "mtp" else [b - 1 for b in s.blocks]


class Phases:
    """Wall time of the executor's round phases (draft, verify, accept: the device acceptance, where the executor
    has it; replay: the feed of a cut block), each bracketed by device syncs so the time is the phase's own. The
    host share of a round is what the Engine's step interval leaves: scheduling, commit, index building."""

    NAMES = ("draft", "verify", "accept", "feed")

    def __init__(self, program, device: str):
        ex, self.device = program.executor, device
        self.seconds = {}
        for name in self.NAMES:
            if hasattr(ex, name):
                setattr(ex, name, self._timed(name, getattr(ex, name)))
        self.reset()

    def reset(self) -> None:
        self.seconds = {name: 0.0 for name in self.NAMES}
        self.rounds = 0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _timed(self, name: str, call):
        def run(*args):
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


class Tracker:
    def __init__(self, handle):
        self.handle = handle
        self.deltas: list[tuple[float, int]] = []  # (time seen, tokens) of every OutputDelta
        self.tokens: list[int] = []
        self.result: GenerationResult | None = None

    def poll(self, now: float) -> None:
        try:
            for ev in self.handle.events(timeout=0):
                if isinstance(ev, OutputDelta):
                    self.deltas.append((now, len(ev.token_ids)))
                    self.tokens.extend(ev.token_ids)
                elif isinstance(ev, GenerationResult):
                    self.result = ev
        except TimeoutError:
            pass


def run_requests(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[Tracker]:
    # stop_ids=(): random weights would otherwise stop at an early eos and shorten the timed stretch
    trackers = [Tracker(engine.submit(GenerationRequest(tuple(p), TokenSession(max_tokens, stop_ids=()), max_tokens,
                                                        seed=0))) for p in prompts]
    live = list(trackers)
    while live:
        engine.step()
        if engine.failure:
            raise RuntimeError(f"engine failed: {engine.failure}")
        now = time.perf_counter()
        for t in live:
            t.poll(now)
        live = [t for t in live if t.result is None]
    for t in trackers:
        if t.result.error is not None:
            raise RuntimeError(f"request failed: {t.result.error}")
    return trackers


def steady(trackers: list[Tracker], timed_tokens: int) -> dict:
    """Median interval between one row's consecutive rounds while every row decodes, over the rounds that end
    within the first `timed_tokens` outputs (later rounds may have less draft room); mean tokens of those rounds."""
    start = max(t.deltas[0][0] for t in trackers)
    end = min(t.deltas[-1][0] for t in trackers)
    gaps, counts = [], []
    for t in trackers:
        done = t.deltas[0][1]
        for (a, _), (b, c) in zip(t.deltas, t.deltas[1:]):
            done += c
            if done <= timed_tokens and a >= start and b <= end:
                gaps.append(b - a)
                counts.append(c)
    if not gaps:
        raise RuntimeError("no round where every request decoded: raise steps")
    ms = statistics.median(gaps) * 1e3
    per_row = statistics.mean(counts)
    B = len(trackers)
    return {"B": B, "step_ms": ms, "tokens_per_step": per_row, "ms_per_token": ms / per_row,
            "tok_s": B * per_row * 1e3 / ms, "rounds": len(gaps)}


def build(s: Settings, name: str, k: int):
    """(program, engine) for model `name`, speculating with k drafts (k = 0: plain decoding)."""
    cfg = config(name)
    spec = SpeculativeConfig(SpeculativeMethod(s.method), k) if k else None
    dflash = k and s.method != "mtp"
    features = (TEXT, MTP) if k and not dflash else (TEXT,)
    drafter = published_drafter(cfg, s.method, max(s.blocks)) if dflash else None
    if s.program == "reference":
        from ninfer.models.qwen3_5.params import logical_parameters
        from ninfer.reference.dflash import Drafter
        from ninfer.reference.model import ReferenceModel
        from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig

        source = random_source(cfg, s.device, torch.float32, features=features)
        model = ReferenceModel(cfg, {n: source(n) for n in logical_parameters(cfg, features)}, torch.float32)
        if drafter is not None:
            from ninfer.models.qwen3_5.drafter import drafter_parameters

            dsource = random_drafter_source(drafter, s.device, torch.float32)
            drafter = Drafter(drafter, {n: dsource(n) for n in drafter_parameters(drafter)},
                              model.weights["embed_tokens.weight"], model.weights["lm_head.weight"], torch.float32)
        program = ReferenceProgram(model, ReferenceProgramConfig(max_concurrency=LANES, max_context=s.max_context,
                                                                 speculative=spec), drafter)
    else:
        from ninfer.fast.memory import device_budget
        from ninfer.fast.program import FastProgram, FastProgramConfig

        free_device(s.device)  # the previous Program's frame is gone only now: free its pools for this budget
        settings = FastProgramConfig(max_concurrency=LANES, max_context=s.max_context, checkpoint_slots=8,
                                     speculative=spec)
        budget = s.budget_bytes if s.budget_bytes is not None else device_budget(0.9)
        source = random_source(cfg, s.device, features=features)
        if drafter is not None:
            target, draft = source, random_drafter_source(drafter, s.device)
            source = lambda n: draft(n) if n.startswith("dflash.") else target(n)  # noqa: E731
        program = FastProgram.build(cfg, source, settings, budget_bytes=budget, device=s.device, kernels=s.kernels,
                                    drafter=drafter)
    return program, Engine(program, EngineConfig(max_concurrency=LANES, prefill_chunk=512), threaded=False)


def teardown(s: Settings, program, engine) -> None:
    """Close the Engine and Program; the caller's frame still holds them, so `build` frees the pools again."""
    close(program, engine)
    free_device(s.device)


def bench_autoregressive(run: Run, name: str, prompts: dict, tokens: int, entry: dict) -> dict:
    """The plain Program's greedy decode of every prompt set: the baseline step and the continuations."""
    s = run.s
    program, engine = build(s, name, 0)
    continuations: dict[tuple[int, ...], list[int]] = {}
    try:
        if s.warmup:
            run_requests(engine, prompts[s.batches[-1]], 4)
        for B in s.batches:
            trackers = run_requests(engine, prompts[B], tokens)
            entry.setdefault("ar", []).append(steady(trackers, tokens - 1))
            continuations.update({tuple(p): t.tokens for p, t in zip(prompts[B], trackers)})
            run.save()
    finally:
        teardown(s, program, engine)
    return continuations


def bench_speculative(run: Run, name: str, prompts: dict, continuations: dict, entry: dict, k: int) -> None:
    s = run.s
    program, engine = build(s, name, k)
    try:
        if s.program == "fast":  # a DFlash run's blocks (k = 15, 7) add their rows to one list
            entry.setdefault("round_graphs", []).extend(
                round_graph_times(program, s.batches, s.prompt_len, s.device, reps=3 if s.device == "cpu" else 20))
            run.save()
        phases = Phases(program, s.device)
        forced = ForcedContinuation(program, continuations, program.limits.vocab_size, s.device)
        for B in s.batches:
            for L in (2, k + 1) if s.warmup else ():  # a partial block (rollback) and a whole one
                forced.reset(L - 1)
                run_requests(engine, prompts[B], 1 + 2 * L)
            for L in lengths(s, k):
                if run.left() < 10:
                    run.results["skipped"].append(f"{name} B={B} L={L} (deadline)")
                    continue
                forced.reset(L - 1)
                phases.reset()
                timed = 1 + s.steps * L
                row = steady(run_requests(engine, prompts[B], timed + k + 1 + L), timed)
                row.update(k=k, L=L, **phases.per_round_ms(),
                           followed=forced.followed / max(forced.followed + forced.diverged, 1))
                row["host_ms"] = row["step_ms"] - sum(row[f"{n}_ms"] for n in ("draft", "verify", "accept", "replay"))
                entry.setdefault("spec", []).append(row)
                run.save()
        program.check_invariants()
    finally:
        teardown(s, program, engine)


def bench_model(run: Run, name: str) -> None:
    s = run.s
    entry = run.results["models"].setdefault(name, {})
    vocab = config(name).vocab_size
    gen = torch.Generator().manual_seed(7)
    prompts = {B: [random_prompt(gen, s.prompt_len, vocab) for _ in range(B)] for B in s.batches}
    # the longest speculative case plus its untimed tail
    top = max(ks(s))
    tokens = 1 + s.steps * (top + 1) + 2 * (top + 1)
    continuations = bench_autoregressive(run, name, prompts, tokens, entry)
    for k in ks(s):
        bench_speculative(run, name, prompts, continuations, entry, k)
    if s.method == "mtp":
        entry["targets"] = targets(name, entry["ar"], entry["spec"], s.k)
        entry["projected"] = projections(entry["spec"], s.k)
        return
    entry["dflash_targets"], entry["projected"] = {}, []
    for k in ks(s):
        rows = [r for r in entry.get("spec", []) if r["k"] == k]
        entry["dflash_targets"][str(k)] = dflash_targets(name, entry["ar"], rows, k)
        entry["projected"] += [dict(p, k=k) for p in projections(rows, k, lengths(s, k), DFLASH_ANCHORS)]


def main() -> int:
    ap = bench_arguments(230.0, "tiny shape on the CPU (reference Program unless --program fast: naive kernels)")
    ap.add_argument("--program", choices=("fast", "reference"), default=None)
    ap.add_argument("--method", choices=("mtp", "dflash", "dflash2"), default="mtp")
    args = ap.parse_args()
    s = SMOKE if args.smoke else Settings()
    s = dataclasses.replace(s, method=args.method)
    if args.method != "mtp":  # the longest block runs 16 tokens a round: fewer rounds keep the part short
        s = dataclasses.replace(s, steps=min(s.steps, 4), blocks=(8,) if args.smoke else s.blocks)
    if args.program:
        s = dataclasses.replace(s, program=args.program)
    run = Run(args.deadline_s, args.out, s, "bench_spec.json")
    run.results.update(program=s.program, k=s.k if s.method == "mtp" else ks(s), method=s.method)
    if not run.need_cuda(args.smoke, print_table):
        return 1
    run.each_model(["tiny"] if args.smoke else args.models.split(","), MIN_SECONDS, bench_model)
    print_table(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
