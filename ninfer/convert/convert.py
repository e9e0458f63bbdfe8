"""``ninfer convert SRC_DIR OUT.ninfer``: an HF Qwen3.5 checkpoint directory -> one value-preserving artifact.

The conversion is planned from safetensors headers first (all problems raised together as ConversionError), then
streamed object by object into an :class:`ArtifactWriter`: peak memory stays near the largest single source tensor
(per-expert MoE weights are streamed expert by expert into their fused parent, never assembled), and the output
appears atomically or not at all.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import torch

from ninfer.artifact.binder import check_bindings, check_drafter_bindings
from ninfer.artifact.build import add_uses, default_provenance, media_type
from ninfer.artifact.writer import ArtifactWriter
from ninfer.models.qwen3_5.drafter import RESOURCE as DRAFTER_RESOURCE
from ninfer.models.qwen3_5.params import TEXT, VISION, logical_parameters

from .drafter import DrafterSource, plan_drafter
from .errors import ConversionError
from .hf_source import HFSource
from .plan import Item, Plan
from .quant.objects import QuantObject
from .quant.planning import add_quantized, plan_weights
from .resources import collect_resources

# Files up to this size are hashed whole; larger weight files by their safetensors header (names, dtypes, shapes,
# offsets) plus size, so provenance costs no second pass over tens of GB.
FULL_HASH_LIMIT = 64 << 20


def _file_record(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    rec: dict[str, Any] = {"name": path.name, "size": size}
    with open(path, "rb") as f:
        if size <= FULL_HASH_LIMIT:
            rec["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
        else:
            head = f.read(8)
            rec["header_sha256"] = hashlib.sha256(head + f.read(int.from_bytes(head, "little"))).hexdigest()
    return rec


def source_provenance(src: HFSource) -> dict[str, Any]:
    names = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "chat_template.jinja", "preprocessor_config.json", "model.safetensors.index.json"]
    files = [src.dir / n for n in names if (src.dir / n).is_file()] + list(src.files)
    return {"dir": str(src.dir.resolve()), "files": [_file_record(f) for f in files]}


def _chunks(src: HFSource, item: Item) -> Iterator[memoryview | torch.Tensor]:
    """The item's source tensors in order (per-expert parts one after another), in the item's dtype."""
    for key in item.keys:
        yield from src.chunks(key, item.dtype)


def _write(src: HFSource, plan: Plan, out: Path, metadata: dict, provenance: dict, progress: bool,
           resources: dict[str, bytes], drafter: tuple[DrafterSource, list[Item]] | None,
           quantized: list[QuantObject]) -> Path:
    # Objects go out in execution order: the logical parameter table's order of each object's first member.
    order = {n: k for k, n in enumerate(logical_parameters(plan.config))}
    jobs = sorted([(order.get(i.name, len(order)), 0, src, i) for i in plan.items] +
                  [(order.get(o.members[0][0], len(order)), 1, src, o) for o in quantized], key=lambda j: j[:2])
    jobs += [(0, 0, drafter[0], i) for i in drafter[1]] if drafter else []
    total = sum(job.nbytes for *_, job in jobs)
    activation = {m: o.activation for o in quantized for m, _ in o.members}
    with ArtifactWriter(out, progress=progress, total_bytes=total, desc=f"convert {src.dir.name}") as w:
        for _, _, source, job in jobs:
            if isinstance(job, QuantObject):
                add_quantized(w, job)
                continue
            w.add_object(job.name, dtype=job.dtype, shape=job.shape, planes={"data": _chunks(source, job)})
            w.bind(job.name, job.name, feature=job.feature, kind=job.kind)
        if plan.tied:
            w.bind("lm_head.weight", "embed_tokens.weight", feature=TEXT, kind="embedding")
        features = tuple(sorted({TEXT, *(b.feature for b in w.bindings.values())}))
        check_bindings(plan.config, w.bindings, features)
        if drafter is not None:
            check_drafter_bindings(drafter[0].drafter, w.bindings)
            resources = {**resources, DRAFTER_RESOURCE: json.dumps(drafter[0].drafter.to_dict()).encode()}
        add_uses(w, lambda site, binding: activation.get(binding, "A16Only"))
        for name, data in resources.items():
            w.add_resource(name, data, media_type(name))
        return w.finish(plan.config.to_dict(), metadata, provenance)


def convert_checkpoint(src_dir: str | Path, out_path: str | Path, *, name: str | None = None,
                       progress: bool = True, dtype: str | torch.dtype | None = None,
                       drafter: str | Path | None = None, quantize: str | None = None, keep: tuple[str, ...] = (),
                       group_size: int = 128) -> Path:
    """Convert an HF Qwen3.5 / Qwen3.5-MoE checkpoint directory into ``out_path`` and return it.

    - ``name``: ``metadata.name`` (default: the architecture, e.g. ``Qwen3_5ForCausalLM``).
    - ``dtype``: ``"bfloat16"``/``"float16"``/``"float32"`` (or the torch dtype) to cast every weight except the
      fp32-kind ``A_log``/``dt_bias``; ``None`` keeps each tensor's source dtype (values preserved exactly).
    - ``progress``: show a tqdm bar over the bytes written.
    - ``quantize``: a recipe (``fp8``, ``q4``, ``q5``, ``nvfp4``) for an unquantized checkpoint; ``keep``: fnmatch
      patterns of logical names the recipe leaves dense; ``group_size``: the q4/q5 group. A checkpoint with a
      ``quantization_config`` is imported as published instead (docs/quantization.md).
    - ``drafter``: a published DFlash / DFlash2 drafter directory stored beside the target as its own bindings
      (``ninfer.convert.drafter``); one that does not fit the target is refused naming the field.

    Raises ConversionError listing every missing, unexpected, mis-shaped or unsupported tensor (nothing is
    written then), and leaves no partial file behind on any failure.
    """
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    src = HFSource(src_dir)
    dsrc = None
    try:
        plan, quantized, recipe = plan_weights(src, dtype, quantize, tuple(keep), group_size)
        drafted = None
        if drafter is not None:
            dsrc = DrafterSource(drafter, plan.config)
            items, problems = plan_drafter(dsrc, dtype)
            if problems:
                raise ConversionError(str(dsrc.dir), problems)
            drafted = (dsrc, items)
        resources, origins = collect_resources(src.dir, vision=any(i.feature == VISION for i in plan.items))
        metadata = {"name": name or plan.config.architecture}
        provenance = default_provenance(
            source=source_provenance(src), recipe=recipe,
            tied_lm_head=plan.tie_reason, resources=origins,
            **({"drafter": source_provenance(dsrc)} if dsrc is not None else {}))
        return _write(src, plan, Path(out_path), metadata, provenance, progress, resources, drafted, quantized)
    finally:
        src.close()
        if dsrc is not None:
            dsrc.close()
