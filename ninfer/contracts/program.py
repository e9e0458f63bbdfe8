"""The Program protocol: the only way the Engine reaches physical state and model execution.

Both the reference Program (CPU torch) and the fast Program (GPU) implement it; the Engine cannot tell them apart.
Only the Engine worker thread calls it. Handles are checked on every call: a stale (slot, generation) pair is an
EngineFailure, never a silent access to another request's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from .batch import PendingBatch, RowDecision, SequenceHandle
from .resources import Infeasible, ResourceChoice, ResourcePlan, ResourceResult, RunningTransaction


@dataclass(frozen=True)
class CostFacts:
    """Physical costs a Program reports for the ResourceManager's cost model (promote a host replica or recompute
    its tokens; demote a checkpoint leaving the device or delete it). The defaults are the documented generic
    fallback of a Program that measured nothing, sized for a CPU-run Program (docs/context-cache.md); the fast
    Program measures its own at start on CUDA."""

    copy_bytes_per_s: float = 8e9  # host <-> device copy of a replica's bytes
    copy_latency_s: float = 2e-5  # fixed cost of one replica copy (launches, synchronization)
    prefill_tokens_per_s: float = 2e3  # prefill throughput at short context (attention's growth is the model's)
    measured: bool = False

    def __post_init__(self) -> None:
        if not (self.copy_bytes_per_s > 0 and self.prefill_tokens_per_s > 0 and self.copy_latency_s >= 0):
            raise ValueError(f"CostFacts need positive rates and a non-negative latency, got {self}")


@dataclass(frozen=True)
class PrefillCosts:
    """The seed's prefill_signature: what prefill and a plain decode step cost on this hardware and model
    configuration (`signature` names both), for the Scheduler's chunk sizing (engine/chunking.py). A piece of t
    tokens from frontier f takes ``max(floor_s, fixed_s + t * token_s) + t * (f + t / 2) * pair_s`` seconds (the
    floor: a short piece still reads every weight once; the last term: attention over the keys before each
    token); one plain decode step at B rows ``decode_step_s[B - 1]``. A piece that fits one of `graph_buckets` (the
    lengths the Program replays as a graph, padded to the smallest that holds it) takes that bucket's measured
    ``graph_piece_s`` at frontier 0 plus ``t * f * pair_s``: no per-piece launch cost, the bucket's padded tokens.
    The defaults are the generic fallback of a Program that measured nothing (`measured` False): the Scheduler then
    runs fixed chunks (docs/engine.md); the fast Program measures its own at start on CUDA."""

    signature: str = "generic"
    fixed_s: float = 0.0
    token_s: float = 5e-4  # 2,000 tokens/s, as CostFacts' fallback
    pair_s: float = 0.0
    floor_s: float = 0.0
    decode_step_s: tuple[float, ...] = ()  # B = 1, 2, ..; empty: not measured (no plain decode graphs)
    max_piece: int = 8192  # the most tokens one prefill call runs as one piece
    measured: bool = False
    graph_buckets: tuple[int, ...] = ()  # ascending piece lengths replayed as graphs (none: every piece eager)
    graph_piece_s: tuple[float, ...] = ()  # a replay of each bucket at frontier 0, non-decreasing
    graph_fixed_s: float = 0.0  # what a graphed piece costs beyond its tokens (reported; piece_s uses the above)
    # a decode round carrying a chunk of each of these lengths at frontier 0 beside one decode row, measured
    # (ascending; none: `mixed_s` falls back to the eager piece's fit)
    mixed_tokens: tuple[int, ...] = ()
    mixed_pass_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.token_s, self.pair_s, self.floor_s, self.graph_fixed_s, *self.decode_step_s,
               *self.graph_piece_s) < 0 or self.max_piece < 1:
            raise ValueError(f"PrefillCosts need non-negative costs and a positive piece, got {self}")
        for lengths, times in ((self.graph_buckets, self.graph_piece_s), (self.mixed_tokens, self.mixed_pass_s)):
            if len(lengths) != len(times) or list(lengths) != sorted(set(lengths)) or list(times) != sorted(times) \
                    or min(times, default=0.0) < 0 or min(lengths, default=1) < 1:
                raise ValueError(f"PrefillCosts need one non-decreasing time per ascending length, got {self}")

    def piece_s(self, tokens: int, frontier: int) -> float:
        """Predicted seconds of one prefill call of `tokens` tokens starting at `frontier`."""
        bucket = next((i for i, b in enumerate(self.graph_buckets) if tokens <= b), None)
        if bucket is not None:
            return self.graph_piece_s[bucket] + tokens * frontier * self.pair_s
        return max(self.floor_s, self.fixed_s + tokens * self.token_s) + tokens * (frontier + tokens / 2) * self.pair_s

    def mixed_s(self, tokens: int, frontier: int, rows: int) -> float:
        """Predicted seconds of a decode round of `rows` rows carrying a chunk of `tokens` prompt tokens from
        `frontier` (`Program.decode(..., prefill=)`), one pass whose every weight is read once for both: the
        measured pass (`mixed_tokens`, one decode row) of the shortest length holding the chunk (a graphed pass
        runs its whole bucket), past the longest along its last segment, plus the attention over the keys before
        the chunk and each row more's share of the plain step's growth with B. Without measured passes, the eager
        piece's fit over tokens + rows rows."""
        if not self.mixed_tokens:
            t = tokens + rows
            return max(self.floor_s, self.fixed_s + t * self.token_s) + tokens * (frontier + tokens / 2) * self.pair_s
        lengths, times = self.mixed_tokens, self.mixed_pass_s
        i = next((j for j, n in enumerate(lengths) if tokens <= n), None)
        if i is not None:
            at = times[i]
        elif len(lengths) == 1:
            at = times[0] * tokens / lengths[0]
        else:
            at = times[-1] + (tokens - lengths[-1]) * (times[-1] - times[-2]) / (lengths[-1] - lengths[-2])
        step, one = self.step_s(rows), self.step_s(1)
        return at + tokens * frontier * self.pair_s + (step - one if step is not None and one is not None else 0.0)

    def step_s(self, rows: int) -> float | None:
        """A plain decode step's seconds at `rows` rows (the widest measured B past them); None if unmeasured."""
        if not self.decode_step_s or rows < 1:
            return None
        return self.decode_step_s[min(rows, len(self.decode_step_s)) - 1]


@dataclass(frozen=True)
class ProgramLimits:
    """Facts fixed when the Program starts; the Engine sizes its lanes and queue from them."""

    max_concurrency: int  # 1..8 active sequences
    max_context: int  # prompt + output tokens of one sequence
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    # The speculative backend that runs ("mtp (k=3)"), None without one; with one, each decode row may carry up
    # to 1 + draft_tokens tokens and its mask entry is a DraftMasks (or None), not one bitmask row.
    speculative: str | None = None
    draft_tokens: int = 0
    costs: CostFacts = CostFacts()  # what a replica copy and a prefilled token cost (the generic fallback here)
    prefill: PrefillCosts = PrefillCosts()  # what a prefill piece and a decode step cost (chunk sizing)
    # Whether a decode round runs a prefill chunk inside its own model pass (`Program.decode(..., prefill=)`, every
    # weight read once for both): the Scheduler then rides staged prefill chunks on decode rounds instead of
    # alternating the two, and sizes the chunks by `PrefillCosts.mixed_s`. A Program may accept `prefill=` either
    # way; False: it would run the chunk as a pass of its own, which alternating units do as well.
    mixed_steps: bool = False
    # Why image prompts are refused (None: the Vision feature is prepared and a request may carry PromptMedia).
    no_vision: str | None = "the Vision feature is not prepared"


@dataclass(frozen=True)
class ResourceUsage:
    """A Program's physical occupancy summary (metrics, and the harness's return-to-baseline check)."""

    active_sequences: int
    reserved_pages: int  # reserved for growth, not yet taken
    sequence_pages: int  # pages referenced by active sequences (shared ones included)
    checkpoint_pages: int  # pages referenced only by published checkpoints
    free_pages: int
    total_pages: int
    checkpoints: int
    free_slots: int
    total_slots: int
    host_checkpoints: int = 0  # checkpoints whose state lives only as a host replica (they hold no slot)
    checkpoint_device_bytes: int = 0  # bytes of inactive checkpoints per tier (shared pages counted once)
    checkpoint_host_bytes: int = 0


@dataclass(frozen=True)
class DraftMasks:
    """What a speculative round needs of one row's Frontend session (a decode mask entry under speculation):
    `fill(drafts)` gives the grammar's int32 [len(drafts) + 1, ceil(V/32)] rows, row i constraining the token after
    drafts[:i] (rows past an illegal or output-ending draft allow everything: they are never reached); `max_block`
    bounds the row's block when the session must see its tokens before more are drawn (a thinking budget's forced
    `</think>` comes after them). None: unconstrained."""

    fill: Callable[[Sequence[int]], Any] | None = None
    max_block: int | None = None


@dataclass(frozen=True)
class PrefillChunk:
    """A prefill chunk riding on a decode round (`Program.decode(..., prefill=)`): up to `max_tokens` further
    prompt tokens of `handle`, and the grammar's mask of its first output token when the chunk finishes the
    prompt."""

    handle: SequenceHandle
    max_tokens: int
    mask: Any | None = None


@runtime_checkable
class Program(Protocol):
    limits: ProgramLimits

    @property
    def resource_revision(self) -> int:
        """Advances on every change of global resource topology; plans sealed earlier go stale."""

    def plan(self, choice: ResourceChoice) -> ResourcePlan | Infeasible:
        """Seal the logical choice against the current revision, or say why it cannot run now / ever."""

    def start(self, plan: ResourcePlan) -> RunningTransaction:
        """Begin the one physical transition. Raises StalePlan (no side effect) when the revision moved."""

    def advance(self, txn: RunningTransaction) -> ResourceResult | None:
        """Run the next stage; the complete result when the transition is done, else None."""

    def abort(self, txn: RunningTransaction) -> ResourceResult:
        """Stop a started transition and return its complete terminal result (claims, pins, releases)."""

    def backfill_feasible(self, head: ResourceChoice, donors: Sequence[SequenceHandle],
                          borrower: ResourceChoice) -> bool:
        """True when, with `borrower` holding its full reservation, the end of `donors` still lets `head` enter
        from root with every inactive checkpoint released. No timing assumption."""

    def prefill(self, handle: SequenceHandle, max_tokens: int, mask: Any | None = None) -> PendingBatch | None:
        """Consume up to `max_tokens` further prompt tokens. Returns the PendingBatch holding the first sampled
        token when this chunk finishes the prompt, else None (the frontier advanced, nothing to preview)."""

    def decode(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None = None,
               prefill: PrefillChunk | None = None) -> PendingBatch:
        """One compact decode round over exactly these sequences (B = len(handles)). With `prefill` (another
        sequence, in staged prefill) the round also consumes that chunk as `prefill` would; the batch is then
        MIXED: the decode rows, then the first-token row when the chunk finished the prompt."""

    def control(self, handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        """Feed a Frontend-supplied forced-control suffix; no sampling, no RNG advance."""

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        """Atomically keep each row's accepted prefix (KV, recurrent state, RNG position, backend state)."""

    def abort_pending(self, batch: PendingBatch) -> None:
        """Drop the whole batch; every row returns to its state before the batch."""

    def prompt_remaining(self, handle: SequenceHandle) -> int:
        """Prompt tokens not yet consumed by prefill."""

    def resource_usage(self) -> ResourceUsage:
        """Current occupancy; with no active sequence, every used page and slot belongs to a checkpoint."""

    def check_invariants(self) -> None:
        """Expensive no-op when all is well; raises AssertionError naming the broken fact otherwise."""
