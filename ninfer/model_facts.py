"""What an artifact says about the model it holds, as the ready line and the request defaults need it.

The weights are described by where they came from, never by a claim the artifact cannot back: the embedded model
says it is random (`metadata.random_weights`), a converted checkpoint names its source directory (provenance
`source.dir`), anything else is of unknown origin. A checkpoint of freshly initialised weights is no more
"trained" than any other; only its name is known. The weights' stored representation follows ("bfloat16",
"float8_e4m3fn 128x128 + bfloat16", "int4 g128 + bfloat16", ...: the text weights' formats, most bytes first).

The sampling defaults follow `--generation-config` as vLLM's does: `auto` takes the artifact's own
`generation_config.json` resource (converted checkpoints and the embedded model carry one), `none` (or vLLM's
`vllm`) takes nothing, and a path names a `generation_config.json` file or a directory holding one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.errors import NotFoundError, UsageError
from ninfer.runtime_options import parse_json_option
from ninfer.sampling.defaults import SamplingDefaults

GENERATION_CONFIG = "generation_config.json"
NO_DEFAULTS = ("none", "vllm")


@dataclass(frozen=True)
class ArtifactFacts:
    name: str | None
    random_weights: bool
    weights: str
    sampling_defaults: SamplingDefaults

    @classmethod
    def read(cls, art: Any, generation_config: str = "auto") -> "ArtifactFacts":
        """From an open artifact reader and the --generation-config option."""
        meta, source = art.metadata, art.provenance.get("source") or {}
        random_weights = bool(meta.get("random_weights"))
        if random_weights:
            weights = "RANDOM weights, output is noise"
        elif isinstance(source, dict) and source.get("dir"):
            weights = f"weights from checkpoint {Path(str(source['dir'])).name}"
        else:
            weights = "weights of unknown origin"
        weights = f"{weights}; {weight_format(art)}"
        own = art.resource(GENERATION_CONFIG) if GENERATION_CONFIG in art.resources else None
        return cls(meta.get("name"), random_weights, weights, sampling_defaults(generation_config, own))


def weight_format(art: Any) -> str:
    """The text weights' stored representations, most bytes first: dtype for dense objects, dtype with the block
    or group for quantized ones."""
    by_rep: dict[str, int] = {}
    for o in {art.objects[b.object].name: art.objects[b.object] for b in art.bindings.values()
              if b.feature == "text"}.values():
        rep = o.dtype
        if o.params.get("block"):
            rep += " " + "x".join(str(int(v)) for v in o.params["block"])
        elif o.params.get("group_size"):
            rep += f" g{int(o.params['group_size'])}"
        by_rep[rep] = by_rep.get(rep, 0) + o.nbytes
    return " + ".join(sorted(by_rep, key=lambda r: -by_rep[r])) or "no weights"


def sampling_defaults(option: str, artifact_config: bytes | None) -> SamplingDefaults:
    """The defaults --generation-config names (auto: the artifact's own file, if it has one)."""
    if option in NO_DEFAULTS or (option == "auto" and artifact_config is None):
        return SamplingDefaults()
    if option == "auto":
        raw, source = artifact_config, f"the artifact's {GENERATION_CONFIG}"
    else:
        path = Path(option)
        file = path / GENERATION_CONFIG if path.is_dir() else path
        if not file.is_file():
            raise NotFoundError(f"no {GENERATION_CONFIG} at {option}").locate(
                "--generation-config", hint="pass auto, none, or a directory or file holding the generation config")
        raw, source = file.read_bytes(), str(file)
    try:
        data = parse_json_option(raw.decode("utf-8", errors="replace"), source) or {}
        return SamplingDefaults.from_generation_config(data, source)
    except ValueError as e:
        raise UsageError(str(e)).locate("--generation-config") from None
