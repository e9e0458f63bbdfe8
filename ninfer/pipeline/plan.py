"""The stage plan: the model cut by layers into contiguous pipeline stages, one per device of `--devices`.

Rank 0 holds the embedding, the final norm, the head and the MTP head beside its layers (the round state, sampling
and MTP stay there), so the default cut balances bytes with those counted on rank 0. Pure Python over the
capacity queries (`ninfer.models.qwen3_5.capacity`), so both Programs plan the same cut and the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.errors import UnavailableError, UsageError
from ninfer.models.qwen3_5.capacity import (gdn_state_bytes_per_layer, kv_bytes_per_token, param_bytes,
                                            weight_bytes_per_layer)
from ninfer.models.qwen3_5.config import FULL, Qwen35Config
from ninfer.models.qwen3_5.params import TEXT, layer_of, logical_parameters

MAX_STAGES = 8


class StageError(UsageError):
    """`--devices` or `--stage-layers` that cannot be honoured; the message names the flag."""


class StageCapacityError(UnavailableError):
    """The devices cannot hold their stages; the message gives the bytes per device."""


@dataclass(frozen=True)
class StagePlan:
    """devices[r] runs layers[r] consecutive layers (rank r); their sum is the model's layer count."""

    devices: tuple[str, ...]
    layers: tuple[int, ...]

    @property
    def stages(self) -> int:
        return len(self.devices)

    def ranges(self) -> tuple[range, ...]:
        """Each rank's layer indices."""
        out, lo = [], 0
        for n in self.layers:
            out.append(range(lo, lo + n))
            lo += n
        return tuple(out)

    def rank_of(self, layer: int) -> int:
        for rank, r in enumerate(self.ranges()):
            if layer in r:
                return rank
        raise ValueError(f"layer {layer} is in no stage of {self.layers}")

    def owned(self, rank: int, layers) -> tuple[int, ...]:
        """Those of `layers` (e.g. the config's attention layers) that rank `rank` runs."""
        r = self.ranges()[rank]
        return tuple(i for i in layers if i in r)


def parse_devices(text: str) -> tuple[str, ...]:
    """`--devices 0,1` (CUDA ordinals), `cuda:0,cuda:1` or `cpu,cpu` -> torch device strings, one per stage."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part.isdigit():
            out.append(f"cuda:{int(part)}")
        elif part == "cpu" or (part.startswith("cuda:") and part[5:].isdigit()):
            out.append(part)
        else:
            raise StageError(f"--devices: {part!r} is not a device (a CUDA ordinal like 0, cuda:N or cpu)")
    if not 1 <= len(out) <= MAX_STAGES:
        raise StageError(f"--devices names {len(out)} devices; 1..{MAX_STAGES} stages are supported")
    if len({d.split(":")[0] for d in out}) > 1:
        raise StageError(f"--devices mixes CPU and CUDA devices ({text}); a pipeline runs on one kind")
    return tuple(out)


def parse_stage_layers(text: str) -> tuple[int, ...]:
    """`--stage-layers 20,20`: layers per stage, in rank order."""
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise StageError(f"--stage-layers must be comma-separated layer counts, got {text!r}") from None


def _rank0_bytes(cfg: Qwen35Config, weight_dtype: str, features: tuple[str, ...]) -> int:
    """Everything that is not a decoder layer: embedding, final norm, head (unless tied), MTP."""
    total = 0
    for spec in logical_parameters(cfg, features).values():
        if layer_of(spec.name) is None and not (spec.name == "lm_head.weight" and cfg.tie_word_embeddings):
            total += param_bytes(spec, weight_dtype)
    return total


def stage_weight_bytes(cfg: Qwen35Config, layers: tuple[int, ...], weight_dtype: str = "bfloat16",
                       features: tuple[str, ...] = (TEXT,)) -> list[int]:
    """Weight bytes each rank holds under the cut `layers`."""
    per_layer, out, lo = weight_bytes_per_layer(cfg, weight_dtype), [], 0
    for n in layers:
        out.append(sum(per_layer[lo:lo + n]))
        lo += n
    out[0] += _rank0_bytes(cfg, weight_dtype, features)
    return out


def balanced_layers(cfg: Qwen35Config, stages: int, weight_dtype: str = "bfloat16",
                    features: tuple[str, ...] = (TEXT,)) -> tuple[int, ...]:
    """The contiguous cut (each stage >= 1 layer) whose largest stage holds the fewest weight bytes; rank 0's
    embedding and head count on rank 0. Ties go to the cut with more layers early (exact, by dynamic programming:
    best[s][i] = the smallest max over s stages of the first i layers)."""
    per_layer, n = weight_bytes_per_layer(cfg, weight_dtype), cfg.num_hidden_layers
    fixed = _rank0_bytes(cfg, weight_dtype, features)
    prefix = [0]
    for b in per_layer:
        prefix.append(prefix[-1] + b)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):  # stage s runs layers j..i-1
                cost = max(best[s - 1][j], prefix[i] - prefix[j] + (fixed if s == 1 else 0))
                if cost < best[s][i]:
                    best[s][i], cut[s][i] = cost, j
    counts, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        counts.append(i - j)
        i = j
    return tuple(reversed(counts))


def plan_stages(cfg: Qwen35Config, devices: tuple[str, ...], stage_layers: tuple[int, ...] | None = None,
                weight_dtype: str = "bfloat16", features: tuple[str, ...] = (TEXT,)) -> StagePlan:
    """The plan for `devices`: `stage_layers` as given (checked), else balanced by bytes."""
    n = cfg.num_hidden_layers
    if len(devices) > n:
        raise StageError(f"--devices names {len(devices)} stages but the model has only {n} layers")
    if stage_layers is None:
        return StagePlan(tuple(devices), balanced_layers(cfg, len(devices), weight_dtype, features))
    if len(stage_layers) != len(devices):
        raise StageError(f"--stage-layers gives {len(stage_layers)} stages for {len(devices)} devices")
    if any(k < 1 for k in stage_layers) or sum(stage_layers) != n:
        raise StageError(f"--stage-layers {','.join(map(str, stage_layers))} must be >= 1 layer each and sum to "
                         f"the model's {n} layers")
    return StagePlan(tuple(devices), tuple(stage_layers))


@dataclass(frozen=True)
class StageMemory:
    """What one rank holds: its weights, and per KV page and per GDN state slot its own layers' share."""

    rank: int
    device: str
    weight_bytes: int
    page_bytes: int  # one page of this rank's attention layers (and the MTP layers' on rank 0)
    slot_bytes: int  # one GDN state slot of this rank's GDN layers


def stage_memory(cfg: Qwen35Config, plan: StagePlan, page_size: int, weight_dtype: str = "bfloat16",
                 kv_dtype: str = "bfloat16", with_mtp: bool = False) -> list[StageMemory]:
    """Each rank's bytes from the shared capacity queries."""
    features = (TEXT, "mtp") if with_mtp else (TEXT,)
    weights = stage_weight_bytes(cfg, plan.layers, weight_dtype, features)
    per_slot = gdn_state_bytes_per_layer(cfg, kv_dtype).total
    out = []
    for rank, device in enumerate(plan.devices):
        attn = len(plan.owned(rank, cfg.attention_layers)) + (cfg.mtp_num_hidden_layers if with_mtp and rank == 0
                                                              else 0)
        gdn = len(plan.owned(rank, [i for i, k in enumerate(cfg.layer_types) if k != FULL]))
        out.append(StageMemory(rank, device, weights[rank], page_size * attn * kv_bytes_per_token(cfg, kv_dtype),
                               gdn * per_slot))
    return out


def kv_pages_per_device(memory: list[StageMemory], budgets: list[int], slots: int,
                        workspace: list[int] | None = None) -> int:
    """KV capacity: the minimum over the devices of the pages each can hold after its weights, `slots` GDN state
    slots and its workspace. Devices shared by several ranks (`0,0`) pool their ranks' needs against one budget.
    A device that cannot hold its stages raises StageCapacityError with the bytes per device."""
    workspace = workspace or [0] * len(memory)
    by_device: dict[str, list[int]] = {}
    for m in memory:
        by_device.setdefault(m.device, []).append(m.rank)
    pages, short, lines = None, False, []
    for (device, ranks), budget in zip(by_device.items(), _budgets(memory, budgets)):
        fixed = sum(memory[r].weight_bytes + slots * memory[r].slot_bytes + workspace[r] for r in ranks)
        per_page = sum(memory[r].page_bytes for r in ranks)
        lines.append(f"{device} (ranks {','.join(map(str, ranks))}): {fixed} bytes of weights, state and workspace "
                     f"+ {per_page} per KV page, {budget} available")
        if budget - fixed < max(per_page, 1):
            short = True
        elif per_page:  # a stage without attention layers holds no KV plane
            here = (budget - fixed) // per_page
            pages = here if pages is None else min(pages, here)
    if short or pages is None:
        raise StageCapacityError("the devices cannot hold their pipeline stages: " + "; ".join(lines))
    return pages


def _budgets(memory: list[StageMemory], budgets: list[int]) -> list[int]:
    """One budget per distinct device, in first-rank order (`budgets` is given per rank; a repeated device's later
    entries must agree with its first)."""
    seen: dict[str, int] = {}
    for m, b in zip(memory, budgets, strict=True):
        seen.setdefault(m.device, b)
    return list(seen.values())
