"""Speculative decoding's machinery through the public Engine, with forced acceptance (issue 11's benchmark).

Random weights make the MTP head's drafts meaningless, so the drafts are replaced: per model, the Program without a
backend first decodes every prompt greedily (the autoregressive baseline, timed), and that continuation becomes the
drafts of the Program with the MTP backend (k = 3), with a wrong token injected at draft index L - 1 so every round
emits exactly L tokens (L = 1..k+1; ninfer.testing.speculation.ForcedDrafts does the same on the CPU from a
reference model). The backend's own draft still runs every round, so its cost stays in the step, and is timed on its
own. Per model and B = 1, 2, 4, 8: ms per round, emitted tokens per row and round, ms per token and tok/s for each
L, the issue's targets at 9B B = 1 with pass/fail, and tok/s projected at perf-anchors' acceptance lengths. Each
round is split into phases (`spec_forcing.Phases`: draft, verify, accept on the device, replay of a cut block, each
between device syncs, and the host rest of the Engine's step interval), so a run tells which part of the round remains
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
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_driver import Tracker, drive, submit  # noqa: E402
from runlog import Run, bench_arguments, close, free_device  # noqa: E402
from shapes import config, published_drafter, random_drafter_source, random_prompt, random_source  # noqa: E402
from spec_forcing import ForcedContinuation, Phases, host_profile  # noqa: E402
from spec_graphs import round_graph_times  # noqa: E402
from spec_report import DFLASH_ANCHORS, dflash_targets, print_table, projections, targets  # noqa: E402

from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.fast.model import kernels as kernel_table  # noqa: E402
from ninfer.models.qwen3_5.params import MTP, TEXT  # noqa: E402
from ninfer.program_core.draft_policy import DraftPolicy, RoundCosts  # noqa: E402
from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod  # noqa: E402

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
    profile_host: bool = False  # one more run of the largest B at L = 3 under cProfile (`host_profile` in the JSON)
    draft_vocab: int | None = None  # the backend's draft_vocab_size (None: the whole vocabulary)
    draft_quant: str | None = None  # the backend's quantization ("fp8": the MTP head's FP8 draft weights)
    phases_everywhere: bool = False  # the synced phase run at every forced length (else at the full block alone)


SMOKE = Settings(device="cpu", kernels="naive", program="reference", batches=(1, 2), prompt_len=12, steps=3,
                 warmup=False, max_context=96, budget_bytes=1 << 30, phases_everywhere=True)
MIN_SECONDS = {"0.8B": 30, "9B": 60, "35B-A3B": 90, "tiny": 1}


def lengths(s: Settings, k: int) -> list[int]:
    """The forced acceptance lengths timed at k drafts: all for MTP, a spread for a DFlash block."""
    if s.method == "mtp":
        return list(range(1, k + 2))
    return sorted({1, 3, 5, (k + 1) // 2 + 1, k + 1})


def ks(s: Settings) -> list[int]:
    return [s.k] if s.method == "mtp" else [b - 1 for b in s.blocks]


def run_requests(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[Tracker]:
    trackers = [submit(engine, p, max_tokens) for p in prompts]
    drive(engine, trackers)
    return trackers


def steady(trackers: list[Tracker], max_tokens: int, room: int = 1) -> dict:
    """Median interval between one row's consecutive rounds while every row decodes, over the rounds that began
    with at least `room` of the row's `max_tokens` left (k + 1: a whole block; later rounds have less draft room);
    mean tokens of those rounds."""
    start = max(t.deltas[0][0] for t in trackers)
    end = min(t.deltas[-1][0] for t in trackers)
    gaps, counts = [], []
    for t in trackers:
        done = t.deltas[0][1]
        for (a, _), (b, c) in zip(t.deltas, t.deltas[1:]):
            whole = done <= max_tokens - room
            done += c
            if whole and a >= start and b <= end:
                gaps.append(b - a)
                counts.append(c)
    if not gaps:
        raise RuntimeError("no round with a whole block while every request decoded: raise steps")
    ms = statistics.median(gaps) * 1e3
    per_row = statistics.mean(counts)
    B = len(trackers)
    return {"B": B, "step_ms": ms, "tokens_per_step": per_row, "ms_per_token": ms / per_row,
            "tok_s": B * per_row * 1e3 / ms, "rounds": len(gaps)}


def build(s: Settings, name: str, k: int):
    """(program, engine) for model `name`, speculating with k drafts (k = 0: plain decoding)."""
    cfg = config(name)
    spec = SpeculativeConfig(SpeculativeMethod(s.method), k, draft_vocab_size=s.draft_vocab,
                             quantization=s.draft_quant) if k else None
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
        # prefill pieces of at most 2048 tokens (the Engine feeds 512): 35B-A3B in bf16 with a drafter leaves an
        # H100 no KV page beside the workspace of 8192-token pieces
        settings = FastProgramConfig(max_concurrency=LANES, max_context=s.max_context, checkpoint_slots=8,
                                     speculative=spec, max_prefill_tokens=2048)
        budget = s.budget_bytes if s.budget_bytes is not None else device_budget(0.9)
        source = random_source(cfg, s.device, features=features)
        if drafter is not None:
            target, draft = source, random_drafter_source(drafter, s.device)
            source = lambda n: draft(n) if n.startswith("dflash.") else target(n)  # noqa: E731
        program = FastProgram.build(cfg, source, settings, budget_bytes=budget, device=s.device, kernels=s.kernels,
                                    drafter=drafter)
    # as served: the fast Program's rounds (plain and speculative) launched ahead of the host's commit
    return program, Engine(program, EngineConfig(max_concurrency=LANES, prefill_chunk=512,
                                                 async_scheduling=s.program == "fast"), threaded=False)


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
            entry.setdefault("ar", []).append(steady(trackers, tokens))
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
        phases.enabled = False  # the timed rows run as served; `add_phases` and the host profile bracket phases
        forced = ForcedContinuation(program, continuations, program.limits.vocab_size, s.device)
        # the timed rows at the full block (a policy without costs); the adaptive ones after them
        costs = program.draft_policy.costs
        if costs is not None:
            entry.setdefault("round_costs", []).append({"k": k, "widths": list(costs.widths),
                                                        "ms": [[1e3 * c for c in row] for row in costs.per_batch]})
        program.draft_policy = DraftPolicy(k)
        for B in s.batches:
            for L in (2, k + 1) if s.warmup else ():  # a partial block (rollback) and a whole one
                forced.reset(L - 1)
                run_requests(engine, prompts[B], 1 + 2 * L)
            for L in lengths(s, k):
                if run.left() < 10:
                    run.results["skipped"].append(f"{name} B={B} L={L} (deadline)")
                    continue
                forced.reset(L - 1)
                row = timed_rounds(run, engine, prompts[B], L, k, f"{name} k={k} B={B} L={L}")
                if row is None:
                    continue
                row.update(k=k, L=L, followed=forced.followed / max(forced.followed + forced.diverged, 1))
                if L == k + 1 or s.phases_everywhere:
                    add_phases(run, engine, prompts[B], phases, forced, row, k, L)
                entry.setdefault("spec", []).append(row)
                run.save()
            if s.profile_host and B == s.batches[-1] and run.left() > 20:
                profile_rounds(engine, prompts[B], forced, phases, k, entry.setdefault("host_profile", []))
                run.save()
        if costs is not None:
            bench_adaptive(run, engine, program, prompts[s.batches[-1]], forced, entry, k, costs)
        program.check_invariants()
    finally:
        teardown(s, program, engine)


def add_phases(run: Run, engine, prompts: list, phases: Phases, forced: ForcedContinuation, row: dict, k: int,
               L: int) -> None:
    """The phases (draft, verify, accept, replay, commit) of forced length L into its row, from one more run of the
    same rounds with each phase bracketed by syncs (`synced_step_ms`: that run's round); host: the synced round
    less the phases (the replay runs inside the commit)."""
    forced.reset(L - 1)
    phases.reset()
    phases.enabled = True
    synced = timed_rounds(run, engine, prompts, L, k, f"phases k={k} B={len(prompts)} L={L}")
    phases.enabled = False
    if synced is None:
        return
    row.update(**phases.per_round_ms(), synced_step_ms=synced["step_ms"])
    row["host_ms"] = synced["step_ms"] - sum(row[f"{n}_ms"] for n in ("draft", "verify", "accept", "commit"))


def timed_rounds(run: Run, engine, prompts: list, L: int, k: int, label: str) -> dict | None:
    """`steady` over s.steps rounds at forced length L, plus one round per request after the first (the Engine
    alternates each admission's prefill with a decode round, so the last request starts up to B - 1 rounds after
    the first: on the GPU, B = 8 at L = 9 and 16 had no common round with less), then the block's room; None (the
    row skipped, `label` noted) when the staggered admissions still left no round where every request decoded."""
    total = 1 + (run.s.steps + len(prompts)) * L + k + 1
    trackers = run_requests(engine, prompts, total)  # a failed request or Engine raises here, never skipped
    try:
        return steady(trackers, total, room=k + 1)
    except RuntimeError as e:
        run.results["skipped"].append(f"{label}: {e}")
        return None


def bench_adaptive(run: Run, engine, program, prompts: list, forced: ForcedContinuation, entry: dict, k: int,
                   costs: RoundCosts) -> None:
    """The Engine's default rounds (`DraftPolicy` over the Program's measured round costs: each round's width
    from the acceptance seen so far) at the largest B and each forced length, from a fresh policy each: tok/s and
    the rounds per width. Issue 12's B = 8 target reads these rows."""
    B = len(prompts)
    for L in lengths(run.s, k):
        if run.left() < 10:
            run.results["skipped"].append(f"adaptive B={B} L={L} (deadline)")
            continue
        program.draft_policy = DraftPolicy(k, costs)
        forced.reset(L - 1)
        row = timed_rounds(run, engine, prompts, L, k, f"adaptive k={k} B={B} L={L}")
        if row is None:
            continue
        row.update(k=k, L=L, widths={str(w): n for w, n in program.draft_policy.rounds.items() if n})
        entry.setdefault("adaptive", []).append(row)
        run.save()


def profile_rounds(engine, prompts, forced: ForcedContinuation, phases: Phases, k: int, into: list) -> None:
    """The rounds of `prompts` at a forced length of 3 under cProfile from the step after the last request's first
    token (the prompts' prefill left out): where the host's share of a round goes."""
    L = min(3, k + 1)
    forced.reset(L - 1)
    entry = {"k": k, "B": len(prompts), "L": L, "from": "the step after every request's first token"}
    trackers, started = [submit(engine, p, 1 + 4 * L + k + 1) for p in prompts], []
    with host_profile(entry, phases) as prof:
        prof.disable()

        def start_after_admissions() -> None:
            if not started and all(t.deltas for t in trackers):
                started.append(True)
                phases.reset()
                prof.enable()
        drive(engine, trackers, start_after_admissions)
    into.append(entry)


def bench_model(run: Run, name: str) -> None:
    s = run.s
    entry = run.results["models"].setdefault(name, {})
    vocab = config(name).vocab_size
    gen = torch.Generator().manual_seed(7)
    prompts = {B: [random_prompt(gen, s.prompt_len, vocab) for _ in range(B)] for B in s.batches}
    # the longest speculative case (with timed_rounds' round per later admission) plus its untimed tail
    top = max(ks(s))
    tokens = 1 + (s.steps + max(s.batches)) * (top + 1) + 2 * (top + 1)
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
        entry["dflash_targets"][str(k)] = dflash_targets(name, entry["ar"], rows, k,
                                                         [r for r in entry.get("adaptive", []) if r["k"] == k])
        entry["projected"] += [dict(p, k=k) for p in projections(rows, k, lengths(s, k), DFLASH_ANCHORS)]


def main() -> int:
    ap = bench_arguments(230.0, "tiny shape on the CPU (reference Program unless --program fast: naive kernels)")
    ap.add_argument("--program", choices=("fast", "reference"), default=None)
    ap.add_argument("--method", choices=("mtp", "dflash", "dflash2"), default="mtp")
    ap.add_argument("--profile-host", action="store_true",
                    help="after the timed rows of the largest B, one run at L = 3 under cProfile")
    ap.add_argument("--batches", default=None,
                    help="batch sizes, comma-separated (default 1,2,4,8; the adaptive rows run at the last)")
    ap.add_argument("--blocks", default=None, help="DFlash block sizes, comma-separated (default: 16,8)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="the backend's draft_vocab_size: drafts from the token ids below it alone")
    ap.add_argument("--draft-quant", choices=("fp8",), default=None,
                    help="the backend's quantization: the MTP head's projections in FP8 for drafting")
    ap.add_argument("--gdn-verify", choices=("blocks", "positions"), default="blocks",
                    help="the verify pass's GDN recurrence over whole blocks (gdn_verify, the default) or per block "
                         "position (gdn_decode once per position): kernels.GDN_BLOCK_VERIFY")
    args = ap.parse_args()
    kernel_table.GDN_BLOCK_VERIFY = args.gdn_verify == "blocks"  # before any Program builds its op table
    s = SMOKE if args.smoke else Settings()
    s = dataclasses.replace(s, method=args.method, profile_host=args.profile_host, draft_vocab=args.draft_vocab,
                            draft_quant=args.draft_quant)
    if args.method != "mtp":  # the longest block runs 16 tokens a round: fewer rounds keep the part short
        blocks = (8,) if args.smoke else tuple(int(b) for b in args.blocks.split(",")) if args.blocks else s.blocks
        s = dataclasses.replace(s, steps=min(s.steps, 4), blocks=blocks)
    if args.program:
        s = dataclasses.replace(s, program=args.program)
    if args.batches:
        s = dataclasses.replace(s, batches=tuple(int(b) for b in args.batches.split(",")))
    run = Run(args.deadline_s, args.out, s, "bench_spec.json")
    run.results.update(program=s.program, k=s.k if s.method == "mtp" else ks(s), method=s.method,
                       draft_vocab=s.draft_vocab, draft_quant=s.draft_quant, gdn_verify=args.gdn_verify)
    if not run.need_cuda(args.smoke, print_table):
        return 1
    run.each_model(["tiny"] if args.smoke else args.models.split(","), MIN_SECONDS, bench_model)
    print_table(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
