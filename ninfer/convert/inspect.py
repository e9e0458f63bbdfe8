"""``ninfer inspect``: a plain-text report of an artifact, and checksum verification of every object."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

from ninfer.artifact.reader import Artifact, open_artifact
from ninfer.models.qwen3_5.drafter import DrafterConfig, DrafterKind


def _mb(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _config_lines(a: Artifact) -> list[str]:
    c = a.config
    lines = [
        f"architecture      {c.architecture}",
        f"layers            {c.num_hidden_layers} ({len(c.linear_layers)} linear attention, "
        f"{len(c.attention_layers)} full attention), MTP layers {c.mtp_num_hidden_layers}",
        f"hidden / vocab    {c.hidden_size} / {c.vocab_size}",
        f"attention         {c.num_attention_heads} q heads, {c.num_key_value_heads} kv heads, head_dim {c.head_dim}",
        f"gated deltanet    {c.linear_num_key_heads} k heads x {c.linear_key_head_dim}, "
        f"{c.linear_num_value_heads} v heads x {c.linear_value_head_dim}, conv {c.linear_conv_kernel_dim}",
    ]
    if c.is_moe:
        lines.append(f"moe               {c.num_experts} experts, top-{c.num_experts_per_tok}, "
                     f"expert width {c.moe_intermediate_size}, shared {c.shared_expert_intermediate_size}")
    else:
        lines.append(f"ffn               intermediate {c.intermediate_size}")
    lines.append(f"tied embeddings   {c.tie_word_embeddings}")
    if c.vision is not None:
        v = c.vision
        lines.append(f"vision            {v.geometry_line()}")
        lines.append(f"vision tokens     image {v.image_token_id}, video {v.video_token_id}, "
                     f"start {v.vision_start_token_id}, end {v.vision_end_token_id}")
    return lines


def _drafter_line(d: DrafterConfig) -> str:
    line = (f"drafter           {d.kind}: {d.num_hidden_layers} layers at hidden {d.hidden_size}, taps target layers "
            f"{list(d.target_layer_ids)}, block {d.block_size}, mask token {d.mask_token_id}")
    if d.kind is DrafterKind.DFLASH2:
        line += (f", conv {d.conv_kernel_size} taps in groups of {d.conv_group_size}, selector rank "
                 f"{d.selector_rank} over top-{d.selector_top_k}")
    return line + (f", window {d.sliding_window}" if d.sliding_window else "")


def _bytes_by(a: Artifact) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Bytes per (feature, kind), each object counted once (at its first binding); shared-object notes."""
    seen: set[str] = set()
    by: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[str, list[str]] = defaultdict(list)
    for b in a.descriptor.bindings:
        holders[b.object].append(b.name)
        if b.object not in seen:
            seen.add(b.object)
            by[(b.feature, b.kind)] += a.objects[b.object].nbytes
    shared = [f"{obj} <- {', '.join(names)}" for obj, names in holders.items() if len(names) > 1]
    return by, shared


def _representation_lines(a: Artifact) -> list[str]:
    """Objects and bytes per (module kind, representation): what a quantized artifact actually stores."""
    kind: dict[str, str] = {}
    for b in a.descriptor.bindings:
        kind.setdefault(b.object, f"{b.feature} {b.kind}")
    by: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for o in a.descriptor.objects:
        if o.name in kind:
            params = ",".join(f"{k}={v}" for k, v in sorted(o.params.items()) if k not in ("scale_dtype",))
            rep = f"{o.format}/{o.dtype}" + (f" [{params}]" if params else "")
            entry = by[(kind[o.name], rep)]
            entry[0] += 1
            entry[1] += o.nbytes
    return [f"  {k:<16} {rep:<52} {n:>5} objects {_mb(nb):>14}" for (k, rep), (n, nb) in sorted(by.items())]


def _object_lines(a: Artifact) -> list[str]:
    lines = []
    for o in a.descriptor.objects:
        if o.name.startswith("resource:"):
            continue
        lines.append(f"  {o.name:<56} {o.format:<9} {o.dtype:<14} {str(list(o.shape)):<18} {o.nbytes:>12,}")
    return lines


def inspect_artifact(path: str | Path, verify: bool = False) -> str:
    """The text report of an artifact; with ``verify``, every checksum is checked first (ArtifactError names the
    first broken object)."""
    out: list[str] = []
    with open_artifact(path, features=None) as a:
        verified = ""
        if verify:
            t0 = time.perf_counter()
            n = a.verify()
            verified = f"checksums         all {len(a.objects)} objects OK ({_mb(n)} in {time.perf_counter() - t0:.2f} s)"
        meta, prov = a.metadata, a.provenance
        out += [f"{Path(path)}  ({_mb(a.header.file_size)}, .ninfer v{a.header.version})",
                f"name              {meta.get('name')}"]
        if meta.get("random_weights"):
            out.append("NOTE: this artifact holds RANDOM weights; its outputs are meaningless text.")
        out += _config_lines(a)
        out.append(f"features          {', '.join(a.available_features)}")
        if a.drafter is not None:
            out.append(_drafter_line(a.drafter))
        recipe = prov.get("recipe", {})
        out.append(f"provenance        {prov.get('converter')} {prov.get('converter_version')} at {prov.get('time')}"
                   f"{', recipe ' + str(recipe) if recipe else ''}")
        if "source" in prov:
            out.append(f"source            {prov['source'].get('dir')}")
        if verified:
            out.append(verified)
        by, shared = _bytes_by(a)
        views = sum(1 for b in a.descriptor.bindings if b.rows is not None)
        out.append(f"objects           {len(a.objects)} ({_mb(sum(o.nbytes for o in a.objects.values()))}); "
                   f"bindings {len(a.descriptor.bindings)} ({views} views); uses {len(a.descriptor.uses)}")
        out.append("bytes by feature/kind:")
        out += [f"  {f:<8} {k:<10} {_mb(n):>16}" for (f, k), n in sorted(by.items())]
        out.append("representation by module kind:")
        out += _representation_lines(a)
        acts = Counter(u.activation for u in a.descriptor.uses)
        out.append("uses by activation: " + ", ".join(f"{k} {v}" for k, v in sorted(acts.items())))
        if shared:
            out.append("shared objects:")
            out += [f"  {s}" for s in shared]
        origins = prov.get("resources", {})
        out.append("resources:")
        for r in a.descriptor.resources:
            n = a.objects[r.object].nbytes
            out.append(f"  {r.name:<26} {r.media_type:<24} {n:>10,} B  {origins.get(r.name, '')}")
        out.append("objects:")
        out += _object_lines(a)
    return "\n".join(out)


def verify_artifact(path: str | Path) -> int:
    """Check every object's checksum; raise ArtifactError naming the first broken one. Returns the bytes checked."""
    with open_artifact(path, features=None) as a:
        return a.verify()
