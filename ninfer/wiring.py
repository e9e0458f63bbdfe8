"""The one place that wires a model into Program + Frontend + Engine (or the CausalScoring core).

`build_runtime(options)` is what both the CLI commands and the HTTP server call: it resolves the model, picks the
Program, builds the Frontend from the artifact's own tokenizer and chat template, warms the Engine up through its
public path with prefix caching off, and returns a `Runtime` that the Gateway drives without ever touching the
Program.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

from ninfer.contracts import RequestRejected
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.engine.scoring import CausalScoreCore
from ninfer.errors import NinferError, NotFoundError, UnavailableError
from ninfer.frontend import Frontend, OutputOptions
from ninfer.frontend.tokenizer import Qwen35Tokenizer, TokenizerLoadError
from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt
from ninfer.program_core.speculative import MissingBackendWeights, SpeculativeConfig, SpeculativeConfigError
from ninfer.model_facts import ArtifactFacts
from ninfer.runtime import Runtime
from ninfer.runtime_options import RuntimeOptions, WiringError

DEFAULT_CONTEXT = 4096  # the reference Program is CPU-bound; a longer default only costs memory
# A window's logits are [window, vocab] floats (~1 MiB a token at 248k vocab): the default keeps one under 1 GiB.
DEFAULT_SCORE_WINDOW = 512


class WarmupError(NinferError):
    """The warmup request did not run cleanly through the Engine: the model loads but does not serve."""


def resolve_model_path(model: str | None, progress: bool = False,
                       report: Callable[[str], None] | None = None) -> Path:
    """A .ninfer file, an HF checkpoint directory (converted once into the cache), or the embedded default."""
    if model is None:
        from ninfer.convert.default_model import default_model_path

        return default_model_path(progress=progress)
    p = Path(model)
    if p.is_file():
        return p
    if p.is_dir():
        from ninfer.convert.cached import converted_path

        return converted_path(p, progress=progress, report=report)
    raise NotFoundError("no such model: neither a .ninfer file nor an HF checkpoint directory").locate(
        model, hint="pass a .ninfer file or a directory holding config.json and *.safetensors")


def _program_kind(requested: str, purpose: str, devices: tuple[str, ...] | None = None) -> str:
    # The scoring windows are the reference Program's (CausalScoring); auto picks it for that purpose.
    if requested == "reference" or (requested == "auto" and purpose == "scoring"):
        return "reference"
    if requested == "fast" and devices is not None and devices[0] == "cpu":
        return "fast"  # asked for on the CPU (`--devices cpu[,cpu..]`): the naive kernels run its stage code there
    available, why = _fast_available()
    if requested == "fast" and not available:
        raise UnavailableError(f"--program fast is not available: {why}").locate(
            "--program", hint="use --program reference (CPU) instead")
    return "fast" if available else "reference"


def _fast_available() -> tuple[bool, str]:
    """The fast Program runs when torch sees a GPU and this build has `ninfer.fast.program.FastProgram` with a
    `from_artifact(path, max_concurrency=, max_context=, gpu_memory_utilization=, speculative_config=)`."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return False, "it needs an NVIDIA GPU and torch sees none"
    if importlib.util.find_spec("ninfer.fast.program") is None:
        return False, "this build has the fast kernels but no fast Program (ninfer.fast.program) to run them"
    return True, ""


def build_runtime(options: RuntimeOptions, *, progress: bool = True,
                  report: Callable[[str], None] | None = None) -> Runtime:
    """Resolve, load, warm up; raises a NinferError with a user-facing message (the model file as its place) for
    bad options and for a model that does not load. ``report`` receives one-off notes such as a conversion."""
    options.check()
    kind = _program_kind(options.program, options.purpose, options.devices)
    speculative = _speculative(options)
    path = resolve_model_path(options.model, progress=progress, report=report)
    try:
        return _load(path, options, kind, progress, speculative)
    except NinferError as e:
        raise e.locate(options.model or str(path))


def _load(path: Path, options: RuntimeOptions, kind: str, progress: bool,
          speculative: SpeculativeConfig | None) -> Runtime:
    from tqdm import tqdm

    start = time.monotonic()
    bar = tqdm(total=3, desc="Loading", unit="step", disable=not progress, leave=False)
    frontend, facts = _frontend(path, options, vision_refusal(path, options))
    bar.update(1)
    name = options.served_model_name or facts.name or path.stem
    rt = Runtime(options, name, path, facts.random_weights, kind, frontend, frontend.max_context, facts.weights,
                 facts.sampling_defaults, _seeds=random.Random(options.seed))
    program = _load_program(path, options, frontend.max_context, kind, speculative, vision=frontend.vision)
    rt.speculative = program.limits.speculative
    rt.eager = kind == "fast" and options.enforce_eager
    if program.stage_plan.stages > 1:
        plan = program.stage_plan
        rt.stages = f"{','.join(plan.devices)}: {','.join(map(str, plan.layers))} layers"
    bar.update(1)
    if options.purpose == "scoring":
        if kind != "reference":
            raise WiringError("--purpose scoring runs on the reference Program here: pass --program reference")
        window = options.score_window or min(frontend.max_context, DEFAULT_SCORE_WINDOW)
        rt.scorer = CausalScoreCore(program.scoring(), window=window, stride=options.score_stride,
                                    max_waiting=4 * options.max_num_seqs)
    else:
        if options.warmup:
            warmup(program, frontend, options)
        rt.engine = Engine(program, _engine_config(options, async_default=kind == "fast"))
    bar.update(1)
    bar.close()
    rt.load_seconds = time.monotonic() - start
    return rt


def vision_refusal(path: Path, options: RuntimeOptions) -> str | None:
    """Why the Vision feature is not prepared (what an image request's 400 says), or None when it is. Both
    Programs serve images, with or without a speculative backend."""
    from ninfer.artifact import open_artifact
    from ninfer.models.qwen3_5.params import VISION

    with open_artifact(path) as art:
        if VISION not in art.available_features:
            return "the model has no vision weights (a text-only artifact)"
    if options.purpose != "generation":
        return "the scoring purpose takes text only"
    if options.limit_mm_per_prompt == 0:
        return "this server takes no images (--limit-mm-per-prompt 0)"
    return None


def _vision_prompt(art, options: RuntimeOptions) -> VisionPrompt:
    from ninfer.frontend.image_processor import ImageProcessorConfig

    data = art.resource("preprocessor_config.json") if "preprocessor_config.json" in art.resources else None
    try:
        processor = ImageProcessorConfig.from_json(data, art.config.vision)
    except ValueError as e:  # json.JSONDecodeError included
        raise WiringError(f"the model's image processor config is unusable: {e}") from None
    limits = VisionLimits(options.limit_mm_per_prompt, options.media_max_pixels)
    return VisionPrompt(art.config.vision, processor, limits)


def _frontend(path: Path, options: RuntimeOptions, no_vision: str | None = "the Vision feature is not prepared"
              ) -> tuple[Frontend, ArtifactFacts]:
    """The Frontend from the artifact's own tokenizer and chat template, with the context contract, and the image
    path unless `no_vision` says why not."""
    from ninfer.artifact import open_artifact

    with open_artifact(path) as art:
        facts = ArtifactFacts.read(art, options.generation_config)
        config = art.config
        tokenizer = Qwen35Tokenizer.load(art.resource("tokenizer.json").decode("utf-8"))
        if tokenizer.vocab_size > config.vocab_size:
            # Qwen3.5 pads the embedding past the tokenizer (248,320 rows for 248,077 ids); fewer rows than ids
            # would let the tokenizer emit ids the model has no row for.
            error = TokenizerLoadError(f"the tokenizer.json has {tokenizer.vocab_size} ids but the model's "
                                       f"vocab_size is {config.vocab_size}")
            error.hint = "convert the checkpoint with the tokenizer it was trained with"
            raise error
        template = None
        if "chat_template.jinja" in art.resources:
            template = art.resource("chat_template.jinja").decode("utf-8")
        vision = _vision_prompt(art, options) if no_vision is None else None
    max_context = options.max_model_len or min(DEFAULT_CONTEXT, config.max_position_embeddings)
    if max_context > config.max_position_embeddings:
        raise WiringError(f"--max-model-len {max_context} exceeds the model's {config.max_position_embeddings}")
    return Frontend(tokenizer, max_context=max_context, chat_template=template,
                    grammar_compile_timeout=options.grammar_compile_timeout, vision=vision,
                    no_vision=no_vision or ""), facts


def _engine_config(options: RuntimeOptions, *, prefix_caching: bool | None = None,
                   async_default: bool = False) -> EngineConfig:
    caching = options.enable_prefix_caching if prefix_caching is None else prefix_caching
    overlap = async_default if options.async_scheduling is None else options.async_scheduling
    return EngineConfig(max_concurrency=options.max_num_seqs, prefix_caching=caching,
                        queue_bound=options.max_queued_requests, queue_timeout=options.queue_timeout,
                        concurrent_prefill=options.concurrent_prefill, cache_device_share=options.cache_device_share,
                        async_scheduling=overlap)


def _speculative(options: RuntimeOptions) -> SpeculativeConfig | None:
    """--speculative-config parsed once; generation only (the scoring windows never decode)."""
    try:
        spec = SpeculativeConfig.parse(options.speculative_config)
    except SpeculativeConfigError as e:
        raise WiringError(str(e)) from None
    if spec is not None and options.purpose == "scoring":
        raise WiringError("--speculative-config: scoring runs no decode rounds; drop the option with --purpose "
                          "scoring")
    return spec


def _load_program(path: Path, options: RuntimeOptions, max_context: int, kind: str,
                  speculative: SpeculativeConfig | None, vision: VisionPrompt | None = None):
    host_bytes = int(options.kv_offloading_size * (1 << 30))
    devices = options.devices
    if kind == "fast":
        from ninfer.fast.program import FastProgram

        # the tower's workspace is sized by the largest image the processor makes (patches of 16 x 16 pixels)
        patches = 0 if vision is None else vision.processor.max_pixels // vision.processor.patch_size ** 2
        try:
            return FastProgram.from_artifact(path, max_concurrency=options.max_num_seqs, max_context=max_context,
                                             gpu_memory_utilization=options.gpu_memory_utilization,
                                             speculative_config=options.speculative_config, host_bytes=host_bytes,
                                             device=None if devices is None else devices[0],
                                             vision_patches=patches, devices=devices,
                                             cuda_graphs=not options.enforce_eager,
                                             stage_layers=options.stage_layers, **_on_cpu(devices, options,
                                                                                          max_context))
        except MissingBackendWeights as e:
            raise WiringError(str(e)) from None
    import torch

    from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig

    dtype = torch.float64 if options.dtype == "float64" else torch.float32
    config = ReferenceProgramConfig(max_concurrency=options.max_num_seqs, max_context=max_context, dtype=dtype,
                                    host_bytes=host_bytes, speculative=speculative, devices=devices or ("cpu",),
                                    stage_layers=options.stage_layers)
    try:
        return ReferenceProgram.from_artifact(path, config, vision=vision is not None)
    except SpeculativeConfigError as e:  # MissingBackendWeights, or a drafter trained for a shorter block
        raise WiringError(str(e)) from None


def _on_cpu(devices: tuple[str, ...] | None, options: RuntimeOptions, max_context: int) -> dict:
    """The fast Program asked for on the CPU runs the naive kernels, its KV pool capped as the reference Program's
    default (every lane at full context, twice) rather than a share of the host memory."""
    if devices is None or devices[0] != "cpu":
        return {}
    from ninfer.fast.program.config import FastProgramConfig

    base = FastProgramConfig(max_concurrency=options.max_num_seqs, max_context=max_context)
    return dict(kernels="naive", kv_pages=2 * options.max_num_seqs * base.pages_for(max_context))


WARMUP_PROMPT = "Warm up."


def warmup(program, frontend: Frontend, options: RuntimeOptions) -> None:
    """Run one short request through a throwaway Engine with prefix caching off (the seed's serve warmup): the
    Program's runtime state gets built, and no continuation or checkpoint is left for a real request to hit."""
    engine = Engine(program, _engine_config(options, prefix_caching=False))
    try:
        prompt = frontend.prepare_text(WARMUP_PROMPT, max_tokens=2)
        session = frontend.open_session(prompt, OutputOptions(max_tokens=2))
        try:
            handle = engine.submit(GenerationRequest(tuple(prompt.token_ids), session, max_tokens=2, seed=0))
        except RequestRejected as e:
            raise WarmupError(f"warmup request refused: {e.message}") from None
        result = handle.result(timeout=600)
        if result.error is not None:
            raise WarmupError(f"warmup request failed: {result.error}")
    finally:
        engine.shutdown()
    left = program.resource_usage()
    if left.checkpoints or left.active_sequences:
        raise WarmupError(f"warmup left state behind ({left.checkpoints} checkpoints, "
                          f"{left.active_sequences} sequences)")
