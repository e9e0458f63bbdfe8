"""FastProgram: the Program protocol over FastModel's device pools, indistinguishable to the Engine from the
reference Program.

Memory is planned once at start from a byte budget; afterwards only page ids, slot ids and block-table rows move.
Everything but the tensor math is the Program core's (`ninfer.program_core.Program`): it drives the device pools
through `DeviceState` (the store) and the model through `FastExecutor`; the device-only invariants are in
`invariants.py`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import torch

from ninfer.contracts import CostFacts, PrefillCosts, ProgramLimits
from ninfer.errors import DoesNotFitError, UnavailableError
from ninfer.fast.dflash_graphs import DFlashDraftGraphs
from ninfer.fast.draft_graphs import DraftGraphRunner
from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.drafter_memory import scratch_pages_per_row
from ninfer.fast.model import FastModel
from ninfer.fast.model.dflash import FastDrafter, load_drafter_weights
from ninfer.fast.model.model import allocate_stage_pools, check_mtp
from ninfer.fast.model.quantized import artifact_quant, draft_fp8, fp8_weight
from ninfer.fast.model.vision import FastVisionTower
from ninfer.fast.model.weights import has_a8_weights, load_fast_weights, quant_workspace_bytes, rank_nbytes
from ninfer.fast.mixed_graphs import MixedGraphRunner
from ninfer.fast.prefill_graphs import PrefillGraphRunner, prefill_buckets
from ninfer.fast.sampling import DeviceSampler
from ninfer.fast.sampling.prefix_masks import PrefixMasks
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.fast.verify_graphs import VerifyGraphRunner
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig
from ninfer.models.qwen3_5.pages import PageAllocator
from ninfer.pipeline.budgets import device_budgets, host_budget
from ninfer.program_core import HostTier, IdPool, Program
from ninfer.program_core.draft_policy import DraftPolicy, candidate_widths
from ninfer.program_core.speculative import (MissingBackendWeights, SpeculativeConfig, SpeculativeMethod,
                                             drafter_fit)

from . import invariants
from .config import FastProgramConfig
from .costs import measure_costs, measure_prefill, measure_rounds
from .dflash_backend import FastDFlashBackend
from .executor import FastExecutor
from .images import HELD, ImageInputs
from .stores import DeviceState


def _dflash(c: FastProgramConfig, model: FastModel, drafter: FastDrafter | None) -> FastDFlashBackend | None:
    """The DFlash backend the config names over the plan's drafter pools, or the start-up error naming the field
    (the reference Program's checks: `drafter_fit`)."""
    spec, plan = c.speculative, model.plan
    if spec is None or spec.method.drafter is None:
        if drafter is not None or plan.drafter is not None:
            raise ValueError("a drafter (or drafter pools) given to a Program whose config runs no DFlash method")
        return None
    block, window = drafter_fit(spec, None if drafter is None else drafter.cfg)
    d = drafter.cfg
    if plan.drafter != (d.num_hidden_layers, d.num_key_value_heads, d.head_dim) or \
            plan.scratch_pages != scratch_pages_per_row(d, plan.page_size):
        raise ValueError(f"the model's memory plan {plan} was not made for this drafter ({d})")
    model.tap(d.target_layer_ids)  # over stages only these cross to rank 0, where the drafter and its pages live
    return FastDFlashBackend(drafter, model.pools, block, window, spec.draft_vocab_size)


def _check_plan(model: FastModel, c: FastProgramConfig) -> bool:
    """Refuse a model whose memory plan, MTP head or stages were not made for the resolved config `c`; whether
    the config runs the MTP backend."""
    plan = model.plan
    if plan.max_seqs != c.max_concurrency or plan.slots != c.usable_slots + c.max_concurrency or \
            plan.page_size != c.page_size or plan.max_context < c.max_context:
        raise ValueError(f"the model's memory plan {plan} was not made by FastProgramConfig.plan for {c}")
    mtp = c.speculative is not None and c.speculative.method is SpeculativeMethod.MTP
    if plan.mtp != mtp:
        raise ValueError(f"the model's memory plan has mtp={plan.mtp}, the config speculative={c.speculative}")
    if mtp and model.mtp is None:
        raise MissingBackendWeights(c.speculative.method, c.speculative.method.needs)
    if (c.stage_plan or model.stages) != model.stages:
        raise ValueError(f"the model's stages {model.stages} are not the config's {c.stage_plan}")
    return mtp


class FastProgram(Program):
    def __init__(self, model: FastModel, config: FastProgramConfig, drafter: FastDrafter | None = None,
                 vision: FastVisionTower | None = None, vision_patches: int = 0):
        """`drafter`: the DFlash / DFlash2 drafter a DFlash method runs (`FastProgram.build` loads it). `vision`:
        the tower, which prepares the Vision feature (image prompts; without it they are refused), warmed on CUDA
        at `vision_patches` (the largest image's patches) before serving."""
        cfg, plan = model.cfg, model.plan
        c = config.resolved(cfg)
        mtp = _check_plan(model, c)
        dflash = _dflash(c, model, drafter)
        self.model = model
        self.device = model.device
        # pipeline stages (docs/pipeline.md): the plan and the residual's link (None: one stage)
        self.stage_plan, self.link = model.stages, model.link
        state_bytes, page_bytes = plan.slot_bytes, plan.page_bytes
        super().__init__(c, PageAllocator(plan.num_pages), IdPool(c.usable_slots, "GDN state slot"),
                         HostTier(c.host_bytes, state_bytes, page_bytes), DeviceState(model.ranks),
                         page_bytes, rows=IdPool(c.max_concurrency, "block-table row"))
        # sampling tables live on block-table rows; the naive model runs the naive sampling ops
        self.sampler = DeviceSampler(cfg.vocab_size, c.max_concurrency, c.max_concurrency, model.device,
                                     kernels="naive" if model.kernels.name == "naive" else "triton",
                                     eos_token_ids=c.eos_token_ids, use_graphs=c.cuda_graphs)
        # the decode graph starts with each row's backup copy (live slot -> the backup slot of its table row)
        self.runner = DecodeGraphRunner(model, c.max_concurrency, sampler=self.sampler,
                                        backup_base=c.backup_slot(0), use_graphs=c.cuda_graphs)
        if vision is not None and vision_patches:
            vision.plan(vision_patches)  # the largest image's activations, before anything else is measured
        piece = min(c.max_prefill_tokens, c.max_context)
        costs = self._measure_costs(piece, dflash, vision, vision_patches)
        verifier, drafter_graphs = self._capture_graphs(c, mtp, dflash, piece)
        prefill = PrefillCosts()  # the generic fallback off CUDA
        if model.device.type == "cuda":  # the plain step per B, replayed or eager; none under a backend
            prefill = measure_prefill(model, self.runner if c.speculative is None else None, piece, _signature(model),
                                      self.pieces, self.mixed)
            if c.speculative is not None and c.speculative.adaptive:  # each round's width from measured costs
                draft = drafter_graphs.dummy_draft if drafter_graphs is not None else dflash.graphs.dummy_draft
                self.draft_policy = DraftPolicy(c.draft_tokens, measure_rounds(verifier, draft))
        no_vision = "the Vision feature is not prepared (no vision tower)" if vision is None else None
        self.vision = None if vision is None else vision.cfg
        self.max_patches = vision_patches  # a larger image would plan a workspace past the budget
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids, costs=costs,
                                    prefill=prefill, speculative=None if c.speculative is None else c.speculative.name,
                                    draft_tokens=c.draft_tokens, no_vision=no_vision,
                                    mixed_steps=not c.draft_tokens)  # a backend's round runs the chunk apart
        self.executor = FastExecutor(model, self.runner, self.sampler, self.store, c.backup_slot, dflash,
                                     ImageInputs(vision, model.device), c.draft_tokens, verifier, drafter_graphs,
                                     self.pieces, None if c.speculative is None else c.speculative.draft_vocab_size,
                                     self.mixed)

    def _measure_costs(self, piece: int, dflash: FastDFlashBackend | None, vision: FastVisionTower | None,
                       vision_patches: int) -> CostFacts:
        """On CUDA (with CUDA graphs or without): one full prefill piece compiles every prefill kernel (the
        drafter's too), then the physical costs are measured and the tower warmed at the largest image; elsewhere
        the generic fallbacks."""
        model = self.model
        if model.device.type != "cuda":
            return CostFacts()
        _warm_prefill(model, piece)
        if dflash is not None:
            dflash.warm(piece)
        costs = measure_costs(model, self.store, piece)
        if vision is not None and vision_patches:
            vision.warm(vision_patches)  # the attention measured, kernels compiled at the largest image
        return costs

    def _capture_graphs(self, c: FastProgramConfig, mtp: bool, dflash: FastDFlashBackend | None, piece: int
                        ) -> tuple[VerifyGraphRunner | None, DraftGraphRunner | None]:
        """Every graph the Program replays, captured before serving; returns the speculative round's (verify,
        draft) runners, None where the config runs none.

        One graph per exact B and sampling variant on CUDA (the sampler's own B = 1 graphs serve prefill draws);
        eager on the same buffers elsewhere and with cuda_graphs off (--enforce-eager). Under a backend no plain
        decode graph would ever run; the round's target pass (per verify width the draft policy may pick) and a cut
        block's replay (verify_graphs.py; with DFlash the drafter context's extension too), the MTP draft
        (draft_graphs.py) and the DFlash draft (dflash_graphs.py) have their own graphs per exact B."""
        model = self.model
        verifier = drafter_graphs = masks = None
        if c.speculative is None:
            self.runner.capture()
        else:  # the round's grammar rows: their bracket's node addresses are these buffers, the Program's
            masks = PrefixMasks(c.max_concurrency, c.draft_tokens, model.cfg.vocab_size, model.device)
            verifier = VerifyGraphRunner(model, c.max_concurrency, c.draft_tokens + 1, c.backup_slot(0),
                                         use_graphs=c.cuda_graphs, dflash=dflash,
                                         widths=candidate_widths(c.draft_tokens) if c.speculative.adaptive else (),
                                         masks=masks)
            verifier.capture()
        if mtp:
            drafter_graphs = DraftGraphRunner(model, c.max_concurrency,
                                              SpecSampler(self.sampler, c.draft_tokens, masks=masks),
                                              use_graphs=c.cuda_graphs,
                                              draft_vocab=c.speculative.draft_vocab_size)
            drafter_graphs.capture()
        if dflash is not None:
            dflash.graphs = DFlashDraftGraphs(dflash, c.max_concurrency, SpecSampler(self.sampler, c.draft_tokens),
                                              use_graphs=c.cuda_graphs)
            dflash.graphs.capture()
        self.sampler.capture()
        # short prefill pieces as graphs (a plain dense model whose plan counted their pool; none with cuda_graphs
        # off, where prefill_graph_tokens resolved to 0), eager on a CPU
        graphed = min(model.plan.prefill_graph_tokens, c.prefill_graph_tokens)
        self.pieces = PrefillGraphRunner(model, graphed) if prefill_buckets(graphed, piece, piece) else None
        if self.pieces is not None:
            self.pieces.capture()
        # a chunk riding in a plain decode round (mixed units), in the prefill graphs' buckets and pool
        self.mixed = MixedGraphRunner(self.pieces, c.max_concurrency, c.backup_slot(0)) \
            if self.pieces is not None and c.speculative is None else None
        if self.mixed is not None:
            self.mixed.capture()
        return verifier, drafter_graphs

    @classmethod
    def build(cls, cfg: Qwen35Config, source, config: FastProgramConfig, *, budget_bytes: int | list[int],
              device: torch.device | str, kernels: str = "triton", quant=None,
              drafter: DrafterConfig | None = None, vision: FastVisionTower | None = None,
              vision_patches: int = 0) -> "FastProgram":
        """Plan the budget, load the weights (`source(logical_name) -> tensor`), allocate the pools once. With
        `quant(logical_name) -> QuantWeight | None` (quantized parameters) the weights load first and the plan
        counts their resident bytes and dequantization transient. `drafter`: the model's DFlash drafter config
        (its ``dflash.*`` weights come from `source`), loaded when the config runs a DFlash method. `vision`,
        `vision_patches`: the loaded tower (whose memory the caller took off `budget_bytes`, `vision_bytes`) and
        the largest image it encodes. Over pipeline stages (`config.devices`) the weights and pools of each rank
        load on its device (rank 0's replaces `device`) and `budget_bytes` may be given per rank."""
        if not cfg.plain_rope:
            # rope_kv_write derives its frequencies from (rotary_dim, theta) alone
            raise UnavailableError(f"the fast Program's kernels compute unscaled RoPE over an even rotary dimension; "
                                   f"this model has rope_type {cfg.rope_type!r} over {cfg.rope_dim} dims").locate(
                "rope_parameters", hint="run it on --program reference")
        if not cfg.silu:
            raise UnavailableError(f"the fast Program's kernels compute SiLU; this model's hidden_act is "
                                   f"{cfg.hidden_act!r}").locate("hidden_act", hint="run it on --program reference")
        if cfg.attention_bias:
            raise UnavailableError("the fast Program's attention has no projection biases").locate(
                "attention_bias", hint="run it on --program reference")
        config = config.resolved(cfg)
        spec, stages = config.speculative, config.stage_plan
        device = device if stages is None else stages.devices[0]
        config = config.on_device(device)
        if spec is None or spec.method.drafter is None:
            drafter = None
        else:
            drafter_fit(spec, drafter)
            if drafter.attention_bias:
                raise UnavailableError("the fast Program's drafter has no projection biases").locate(
                    "attention_bias", hint="run it on --program reference")
        # the MTP head's projections, and under a draft vocabulary its draft head, in FP8 for drafting
        # ("quantization": "fp8", `draft_quant`)
        fp8_draft = spec is not None and spec.quantization == "fp8"
        if quant is None and not fp8_draft:
            model = FastModel.build(cfg, source, config.plan(cfg, budget_bytes, drafter=drafter), device, kernels,
                                    stages)
        else:  # weights first: the plan counts their resident bytes and dequantization transient
            mtp = spec is not None and spec.method is SpeculativeMethod.MTP
            check_mtp(cfg, mtp)
            weights = load_fast_weights(cfg, source, config.dtype, device, mtp=mtp, quant=quant, stages=stages,
                                        mtp_quant=draft_fp8(cfg, source, device) if fp8_draft else None)
            if fp8_draft and spec.draft_vocab_size is not None:
                head = "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
                weights.mtp.head = fp8_weight(source(head)[:spec.draft_vocab_size], device)
            if has_a8_weights(weights):  # a short piece padded to a bucket would quantize its activations
                config = dataclasses.replace(config, prefill_graph_tokens=0)
            act = torch.finfo(config.dtype).bits // 8
            resident = weights.nbytes if stages is None else rank_nbytes(weights, stages)
            plan = config.plan(cfg, budget_bytes, resident, quant_workspace_bytes(weights, act), drafter)
            model = FastModel(cfg, weights, allocate_stage_pools(cfg, plan, device, stages), kernels, stages)
        return cls(model, config, None if drafter is None else _load_drafter(model, drafter, source), vision,
                   vision_patches)

    @classmethod
    def from_artifact(cls, path: str | Path, *, max_concurrency: int, max_context: int,
                      gpu_memory_utilization: float = 0.9, speculative_config: Mapping[str, Any] | None = None,
                      budget_bytes: int | None = None, device: torch.device | str | None = None,
                      kernels: str = "triton", vision_patches: int = 0, **config: Any) -> "FastProgram":
        """The Program over a .ninfer artifact's text weights. The budget is `budget_bytes`, else (CUDA only)
        `gpu_memory_utilization` of the device's total memory minus what others already use (over pipeline stages,
        `config`'s `devices`, each device's: `device_budgets`; on the CPU that share of the free host memory, and
        `kv_pages` should cap the pool there). `config` passes
        further FastProgramConfig fields (page_size, checkpoint_slots, kv_pages, dtype, ...). `vision_patches` > 0
        (the processor's max_pixels / patch^2) loads the vision tower (the artifact must bind the Vision feature)
        and takes its weights, one encode of that many patches and `HELD` images' features off the budget."""
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import TEXT

        spec = SpeculativeConfig.parse(speculative_config)
        settings = FastProgramConfig(max_concurrency=max_concurrency, max_context=max_context, speculative=spec,
                                     **config)
        devices = settings.devices if settings.devices and len(settings.devices) > 1 else None
        device = torch.device(devices[0] if devices else device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if budget_bytes is None:
            budget_bytes = device_budgets(devices, gpu_memory_utilization) if devices else \
                _device_budget(gpu_memory_utilization, device)
        features = (TEXT,)
        if spec is not None:
            with open_artifact(path) as art:
                if spec.method.feature not in art.available_features:
                    raise MissingBackendWeights(spec.method, spec.method.needs)
            features = (TEXT, spec.method.feature)
        vision = None
        if vision_patches > 0:
            kind = "naive" if kernels == "naive" else "triton"
            vision = FastVisionTower.from_artifact(path, settings.dtype, device, kind, settings.cuda_graphs)
            held = vision_bytes(vision, vision_patches)  # on rank 0
            budget_bytes = [budget_bytes[0] - held, *budget_bytes[1:]] if isinstance(budget_bytes, list) else \
                budget_bytes - held
        with open_artifact(path, features=features) as art:
            quant, names = artifact_quant(art, device, art.config.tie_word_embeddings)
            return cls.build(art.config, art.dequantize, settings, budget_bytes=budget_bytes, device=device,
                             kernels=kernels, quant=quant if names else None, drafter=art.drafter, vision=vision,
                             vision_patches=vision_patches)

    def check_invariants(self) -> None:
        invariants.check_invariants(self)


def _signature(model: FastModel) -> str:
    """The prefill_signature's key: the hardware class and the model configuration the costs were measured for."""
    cfg, plan = model.cfg, model.plan
    return (f"{torch.cuda.get_device_name(model.device)} | {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}"
            f"{', MoE' if cfg.is_moe else ''}, {model.kernels.name} kernels, {plan.dtype} | piece "
            f"{plan.max_prefill_tokens}")


def vision_bytes(tower: FastVisionTower, patches: int) -> int:
    """What serving images of at most `patches` patches holds on the device: the tower's weights, one encode's
    transients and `HELD` images' features (`images.py`)."""
    v = tower.cfg
    features = patches // v.merge_unit * v.out_hidden_size * torch.finfo(tower.dtype).bits // 8
    return tower.weight_bytes + tower.workspace_bytes(patches) + HELD * features


def _load_drafter(model: FastModel, drafter: DrafterConfig, source) -> FastDrafter:
    """The drafter's weights on the model's device, over the target's embedding and lm_head."""
    lm_head = model.weights.lm_head
    if not isinstance(lm_head, torch.Tensor):
        raise UnavailableError("the fast DFlash drafter drafts through a dense lm_head; this model's is "
                               "quantized").locate("lm_head", hint="run it on --program reference")
    weights = load_drafter_weights(drafter, source, model.plan.dtype, model.device)
    return FastDrafter(drafter, weights, model.kernels, model.weights.embed, lm_head)


def _warm_prefill(model: FastModel, tokens: int) -> None:
    """One full prefill piece on the dummy slot and row before serving (vLLM's profile run): every prefill kernel
    compiles and every autotuner settles now, not in the middle of the first long request."""
    plan = model.plan
    model.prefill(torch.zeros(tokens, dtype=torch.long, device=model.device), plan.dummy_slot, plan.dummy_row, 0)
    for device in set(model.devices):
        torch.cuda.synchronize(device)


def _device_budget(utilization: float, device: torch.device) -> int:
    """vLLM's meaning: the Program may use `utilization` of the device's total memory, less what other processes
    and this one already hold."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    if device.type == "cpu":
        return host_budget(utilization)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"no CUDA device for gpu_memory_utilization on {device}: pass budget_bytes")
    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * utilization) - (total - free)
    if budget <= 0:
        raise DoesNotFitError(f"gpu_memory_utilization {utilization} of {total / 2**30:.1f} GiB leaves nothing: "
                          f"{(total - free) / 2**30:.1f} GiB are already in use")
    return budget
