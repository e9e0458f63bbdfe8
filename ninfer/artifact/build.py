"""High-level artifact building: logical tensors + config + resources -> one ``.ninfer`` file.

This is the layout every value-preserving artifact uses: one dense object per logical parameter, a whole-object
Binding for it, one Use per consumer site, and a tied ``lm_head.weight`` bound to the embedding's object.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

import ninfer
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, VISION, ParamSpec, logical_parameters

from .errors import ArtifactError
from .writer import ArtifactWriter

MEDIA_TYPES = {".json": "application/json", ".jinja": "text/x-jinja2", ".txt": "text/plain"}

# A parameter the Program consumes in more than one place keeps one Use per place; MTP reuses the main embedding
# and lm_head (mtp_use_dedicated_embeddings=false).
SHARED_SITES = {"embed_tokens.weight": ("embed_tokens", "mtp.embed_tokens"), "lm_head.weight": ("lm_head", "mtp.lm_head")}


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(Path(name).suffix, "application/octet-stream")


def use_sites(binding: str, feature: str, mtp_bound: bool) -> list[tuple[str, str]]:
    """(site, feature) of each consumer of a binding: the parameter's module path, plus MTP sites of shared ones."""
    if binding in SHARED_SITES:
        main, mtp_site = SHARED_SITES[binding]
        return [(main, TEXT)] + ([(mtp_site, MTP)] if mtp_bound else [])
    return [(binding.removesuffix(".weight"), feature)]


def default_provenance(**extra: Any) -> dict[str, Any]:
    return {"converter": "ninfer", "converter_version": ninfer.__version__,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}


def add_uses(w: ArtifactWriter, activation: Callable[[str, str], str] | None = None) -> None:
    """One Use per consumer site of every binding in the writer (``activation(site, binding)`` picks the permission)."""
    mtp_bound = any(b.feature == MTP for b in w.bindings.values())
    for b in list(w.bindings.values()):
        for site, feature in use_sites(b.name, b.feature, mtp_bound):
            w.use(site, b.name, feature=feature, activation=activation(site, b.name) if activation else "A16Only")


def write_artifact(path: str | Path, cfg: Qwen35Config, tensors: Iterable[tuple[str, torch.Tensor]],
                   resources: Mapping[str, bytes | str] | None = None, metadata: Mapping[str, Any] | None = None,
                   tied: bool | None = None, *, provenance: Mapping[str, Any] | None = None,
                   progress: bool = False) -> Path:
    """Write a value-preserving ``.ninfer`` artifact from logical tensors and return its path.

    - ``tensors``: ``(logical_name, tensor)`` pairs, consumed one at a time (a generator keeps memory flat). Names are
      those of ``logical_parameters(cfg)`` (``embed_tokens.weight``, ``layers.3.self_attn.q_proj.weight``,
      ``mtp.fc.weight``...) and, when ``cfg.vision`` holds the tower's geometry, its ``visual.*`` parameters. bf16/fp16/fp32 tensors are stored as they are,
      except that ``fp32``-kind parameters (A_log, dt_bias) are stored in fp32.
    - ``tied`` (default ``cfg.tie_word_embeddings``): bind ``lm_head.weight`` to the embedding's object; an
      ``lm_head.weight`` tensor in ``tensors`` is then ignored.
    - ``resources``: Frontend blobs by name, e.g. ``{"tokenizer.json": ..., "chat_template.jinja": ...,
      "generation_config.json": ...}``.
    - ``metadata``: ``name`` defaults to the architecture; put ``"random_weights": True`` for synthetic models.

    Every text parameter must be given (MTP and vision ones all or none), with the logical shape; otherwise ArtifactError lists
    all missing, unexpected and mis-shaped names at once and no file is left behind.
    """
    tied = cfg.tie_word_embeddings if tied is None else tied
    specs = logical_parameters(cfg, (TEXT, MTP, VISION))
    with ArtifactWriter(path, progress=progress) as w:
        problems = []
        for name, tensor in tensors:
            if tied and name == "lm_head.weight":
                continue
            spec = specs.get(name)
            if spec is None:
                problems.append(f"unexpected tensor {name!r}")
                continue
            if tuple(tensor.shape) != spec.shape:
                problems.append(f"{name!r} has shape {list(tensor.shape)}, expected {list(spec.shape)}")
                continue
            if spec.kind == "fp32":
                tensor = tensor.to(torch.float32)
            w.add_tensor(name, tensor)
            w.bind(name, name, feature=spec.feature, kind=spec.kind)
        if tied and "embed_tokens.weight" in w.objects:
            w.bind("lm_head.weight", "embed_tokens.weight", feature=TEXT, kind="embedding")
        problems += missing_parameters(specs, w.bindings)
        if problems:
            raise ArtifactError("tensors", "do not match the config's logical parameters", "; ".join(problems))
        add_uses(w)
        for rname, data in (resources or {}).items():
            w.add_resource(rname, data, media_type(rname))
        meta = {"name": cfg.architecture, **dict(metadata or {})}
        return w.finish(cfg.to_dict(), meta, provenance or default_provenance())


def missing_parameters(specs: Mapping[str, ParamSpec], bound: Mapping[str, Any]) -> list[str]:
    """Text parameters not bound; MTP (vision) ones only when some MTP (vision) parameter is bound: an absent MTP
    head or vision tower is fine."""
    present = {TEXT} | {s.feature for n, s in specs.items() if n in bound}
    return [f"missing tensor {n!r}" for n, s in specs.items() if n not in bound and s.feature in present]


def add_packed(w: ArtifactWriter, name: str, values: torch.Tensor, *, format: str, dtype: str,
               params: Mapping[str, Any] | None = None):
    """Quantize/pack a tensor with a numeric format and append it as one object (dense keeps its bytes as given
    when ``dtype`` matches the tensor)."""
    from .formats import get_format

    if format == "dense" and str(values.dtype).removeprefix("torch.") == dtype:
        return w.add_tensor(name, values)
    planes = get_format(format).pack(values.detach().float().numpy(), dtype, dict(params or {}))
    return w.add_object(name, format=format, dtype=dtype, shape=tuple(values.shape), planes=planes, params=params)


def add_fused(w: ArtifactWriter, parent: str, members: list[tuple[str, torch.Tensor]], *, feature: str, kind: str,
              format: str = "dense", dtype: str | None = None, params: Mapping[str, Any] | None = None) -> list:
    """Store several logical parameters' rows in ONE parent object (concatenated along axis 0, in order) and bind
    each member as a row view of it, e.g. q_proj and k_proj in one int4 parent. Returns the Bindings."""
    dtype = dtype or str(members[0][1].dtype).removeprefix("torch.")
    add_packed(w, parent, torch.cat([t for _, t in members], dim=0), format=format, dtype=dtype, params=params)
    out, start = [], 0
    for name, t in members:
        out.append(w.bind(name, parent, feature=feature, kind=kind, rows=(start, start + t.shape[0])))
        start += t.shape[0]
    return out
