"""The fast Program's physical costs, measured once at start on CUDA (after the prefill warm-up, on the dummy slot,
row and page, so no live state is touched). For the context cache's cost model: prefill throughput of one piece,
and a pinned host-to-device copy of one GDN slot's state (the bulk of a short replica) and of one KV page (the
fixed cost of a copy). For the Scheduler's chunk sizing (the prefill_signature, `PrefillCosts`): three timed
prefill pieces fit the fixed, per-token and attention cost of an eager piece, one run of each prefill graph bucket
(`PrefillGraphRunner.run`: the slot reset, the inputs' copy and the replay) times a graphed piece, decode rounds
with a chunk riding (`mixed_costs`: each mixed graph bucket, then eager passes up to 2048 tokens) time the mixed
units' pass, and one greedy
step per B on the decode runner's dummy rows times the plain step (its graph's replay; with CUDA graphs off,
``FastProgramConfig.cuda_graphs``, the eager step, so the Scheduler still sizes chunks against a measured step).
Under a speculative backend, for the draft policy (`RoundCosts`): a round per B and verify width, its draft and
verify pass.
Off CUDA the Program reports the generic fallbacks (`CostFacts()`, `PrefillCosts()`: docs/context-cache.md,
docs/engine.md).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ninfer.contracts import CostFacts, PrefillCosts
from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.mixed_graphs import MixedGraphRunner
from ninfer.fast.model import FastModel
from ninfer.fast.prefill_graphs import PrefillGraphRunner
from ninfer.fast.verify_graphs import VerifyGraphRunner
from ninfer.program_core.draft_policy import RoundCosts

from .stores import DeviceState

MEASURE_TOKENS = 2048  # the timed prefill piece (at most the Program's own piece and context)
SHORT_TOKENS = 256  # the short timed piece: mostly the fixed cost and the projections
FLOOR_TOKENS = 64  # the shortest piece a chunk is (one GDN chunk): the floor, every weight read once
DEEP_FRONTIER = 4096  # the short piece again this deep: the attention term
MIXED_TOKENS = (64, 256, 512, 1024, 2048)  # eager chunks timed riding in a decode round, past the graphed ones


def measure_costs(model: FastModel, store: DeviceState, tokens: int) -> CostFacts:
    device, plan = model.device, model.plan
    ids = torch.zeros(min(tokens, MEASURE_TOKENS), dtype=torch.long, device=device)
    prefill = _best(device, lambda: model.prefill(ids, plan.dummy_slot, plan.dummy_row, 0), repeats=2)
    state = store.load_slot(plan.dummy_slot)  # pinned host copies, as a replica's
    page = store.load_pages([plan.dummy_page])
    bulk = _best(device, lambda: store.store_slot(plan.dummy_slot, state))
    latency = _best(device, lambda: store.store_pages([plan.dummy_page], page))
    nbytes = sum(t.numel() * t.element_size() for t in state)
    return CostFacts(copy_bytes_per_s=nbytes / max(bulk - latency, 1e-7), copy_latency_s=latency,
                     prefill_tokens_per_s=len(ids) / prefill, measured=True)


def measure_prefill(model: FastModel, runner: DecodeGraphRunner | None, tokens: int, signature: str,
                    pieces: PrefillGraphRunner | None = None, mixed: MixedGraphRunner | None = None) -> PrefillCosts:
    """Fit ``max(floor, fixed + t * token) + t * (f + t / 2) * pair`` to four prefill pieces on the dummy slot and
    row (t = 64 for the floor, 256 and 2048 at frontier 0, 256 at 4096, as far as the piece and context allow; the
    dummy row's every entry is the dummy page, so a deep piece reads real-sized attention over it; where 256 is a
    prefill graph bucket, the deep piece's extra time is its graph's, deep against at 0), and time one
    greedy step of `runner` per B = 1..max_batch on the dummy rows (`DecodeGraphRunner.dummy_step`; None: no plain
    step, a speculative backend's rounds); with `pieces`, each prefill graph bucket's run (`graph_costs`)."""
    device, plan = model.device, model.plan
    long_t, short_t = min(tokens, MEASURE_TOKENS), min(tokens, SHORT_TOKENS)
    deep = max(0, min(DEEP_FRONTIER, plan.max_context - short_t))

    def piece(t: int, f: int) -> float:
        ids = torch.zeros(t, dtype=torch.long, device=device)
        return _best(device, lambda: model.prefill(ids, plan.dummy_slot, plan.dummy_row, f), repeats=2)

    t_short, t_long, t_deep = piece(short_t, 0), piece(long_t, 0), piece(short_t, deep)
    if deep and pieces is not None and pieces.bucket(short_t) == short_t:
        # from the graph's replays: an eager piece's host time varies by more than the attention it adds
        g0, g_deep = (_best(device, lambda f=f: pieces.run([0] * short_t, plan.dummy_slot, plan.dummy_row, f))
                      for f in (0, deep))
        t_deep = t_short + g_deep - g0
    pair = max(0.0, (t_deep - t_short) / (short_t * deep)) if deep else 0.0
    # the two frontier-0 pieces, less their in-piece attention t^2/2 * pair, give the fixed and per-token costs
    a, b = t_short - short_t ** 2 / 2 * pair, t_long - long_t ** 2 / 2 * pair
    token = max(0.0, (b - a) / (long_t - short_t)) if long_t > short_t else max(0.0, a / short_t)
    floor = piece(min(tokens, FLOOR_TOKENS), 0)
    steps = () if runner is None else \
        tuple(_best(device, runner.dummy_step(B)) for B in range(1, runner.max_batch + 1))
    buckets, times, fixed = graph_costs(pieces, token, lambda fn: _best(device, fn)) if pieces else ((), (), 0.0)
    mixed_tokens, mixed_s = mixed_costs(model, tokens, mixed) if runner is not None else ((), ())
    return PrefillCosts(signature=signature, fixed_s=max(0.0, a - short_t * token), token_s=token, pair_s=pair,
                        floor_s=floor, decode_step_s=steps, max_piece=plan.max_prefill_tokens, measured=True,
                        graph_buckets=buckets, graph_piece_s=times, graph_fixed_s=fixed,
                        mixed_tokens=mixed_tokens, mixed_pass_s=mixed_s)


def mixed_costs(model: FastModel, tokens: int, graphs: MixedGraphRunner | None = None
                ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(chunk lengths, seconds) of decode rounds with a chunk of each length riding beside one decode row, at
    frontier 0 on the dummy slot and row (every page the dummy page: the writes land nowhere that counts), made
    non-decreasing: each mixed graph bucket's run (`MixedGraphRunner.run`) and the eager pass (`FastModel.mixed`,
    launches and all: its host time exceeds its device time at short chunks) at the longer lengths."""
    device, plan = model.device, model.plan
    graphed = () if graphs is None else graphs.buckets
    lengths = tuple(sorted({*graphed, *(t for t in MIXED_TOKENS if t > max(graphed, default=0))} &
                           set(range(1, min(tokens, plan.max_prefill_tokens) + 1))))
    slot, row = plan.dummy_slot, plan.dummy_row

    def timed(t: int) -> float:
        if t in graphed:
            return _best(device, lambda: graphs.run([0] * t, slot, row, 0, ([0], [slot], [row], [0])), repeats=2)
        ids, one = torch.zeros(t, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device)
        return _best(device, lambda: model.mixed(ids, slot, row, 0, (one, [slot], [row], [0])), repeats=2)
    raw = [timed(t) for t in lengths]
    return lengths, tuple(max(raw[:i + 1]) for i in range(len(raw)))


def measure_rounds(verifier: VerifyGraphRunner, draft: Callable[[int, int], Callable[[], object]]) -> RoundCosts:
    """Seconds of a speculative round of B = 1..max_batch rows at each of the verifier's widths on the dummy slot
    and row: the verify pass of B full blocks (its graph's replay) plus, past width 1, `draft(B, width - 1)`'s run
    (the backend's greedy draft of that many tokens). The round's host work (fills, acceptance, the readback) is
    left out: it is about the same at every width, so leaving it out only makes narrow rounds look cheaper. Where
    the plan keeps no step states, also the replay pass of B rows at each width past 1 (a cut block's kept tokens,
    at most width - 1 a row, consumed again at commit: `RoundCosts.replays`)."""
    device = verifier.model.device
    replay = not verifier.model.plan.step_slots
    per_batch, replays = [], []
    for B in range(1, verifier.max_batch + 1):
        row = []
        for w in verifier.widths:
            seconds = _best(device, verifier.dummy_pass(B, w))
            row.append(seconds + (_best(device, draft(B, w - 1)) if w > 1 else 0.0))
        per_batch.append(tuple(row))
        if replay:
            replays.append(tuple(_best(device, verifier.dummy_pass(B, w, backup=False)) if w > 1 else 0.0
                                 for w in verifier.widths))
    return RoundCosts(verifier.widths, tuple(per_batch), tuple(replays))


def graph_costs(pieces: PrefillGraphRunner, token_s: float, timed: Callable[[Callable[[], object]], float]
                ) -> tuple[tuple[int, ...], tuple[float, ...], float]:
    """(buckets, seconds of a whole bucket's run at frontier 0 on the dummy slot and row, made non-decreasing so a
    longer piece never predicts faster, the graphed fixed cost). The fixed cost is the intercept of the line
    through the two largest buckets (one bucket: less its tokens at the eager per-token cost `token_s`)."""
    plan = pieces.model.plan
    raw = [timed(lambda b=b: pieces.run([0] * b, plan.dummy_slot, plan.dummy_row, 0)) for b in pieces.buckets]
    times = tuple(max(raw[:i + 1]) for i in range(len(raw)))
    per = token_s if len(times) < 2 else (times[-1] - times[-2]) / (pieces.buckets[-1] - pieces.buckets[-2])
    return pieces.buckets, times, max(0.0, times[-1] - pieces.buckets[-1] * per)


def _best(device: torch.device, fn: Callable[[], object], repeats: int = 3) -> float:
    """The shortest of `repeats` synchronized runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best
