"""Each device's byte budget for its stages, with `--gpu-memory-utilization`'s meaning (vLLM's): that share of a
CUDA device's total memory, less what other processes and this one already hold there; on the CPU (`cpu,cpu`: the
stage code run by the tests and the CLI) that share of the host memory free now."""

from __future__ import annotations

import os

import torch

from ninfer.models.qwen3_5.config import Qwen35Config

from .plan import StageMemory, StagePlan, kv_pages_per_device, stage_memory


def device_budgets(devices: tuple[str, ...], utilization: float) -> list[int]:
    """One budget per rank (a device named twice gets the same figure: `kv_pages_per_device` pools its ranks)."""
    out = []
    for d in devices:
        if d == "cpu":
            out.append(host_budget(utilization))
            continue
        free, total = torch.cuda.mem_get_info(torch.device(d))
        out.append(int(total * utilization) - (total - free))
    return out


def host_budget(utilization: float) -> int:
    """`utilization` of the host memory free now."""
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * utilization)


def stage_kv_pages(cfg: Qwen35Config, plan: StagePlan, budgets: list[int], *, page_size: int, slots: int,
                   with_mtp: bool) -> tuple[int, list[StageMemory]]:
    """The KV pages every device of the plan can hold (bf16 weights, KV and conv windows: the fast Program's
    dtype), and each rank's bytes; StageCapacityError with the bytes per device when one cannot hold its stages."""
    memory = stage_memory(cfg, plan, page_size, "bfloat16", "bfloat16", with_mtp)
    return kv_pages_per_device(memory, budgets, slots), memory
