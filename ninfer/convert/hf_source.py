"""An HF Qwen3.5 checkpoint directory as a lazy source of tensors under ninfer's logical names.

Only safetensors headers are read up front (names, shapes, dtypes); tensor bytes are read one at a time with
``safe_open`` when the writer asks for them. Key mapping:

==============================================  =====================================  ========
checkpoint key                                   logical name                           feature
==============================================  =====================================  ========
``model.language_model.X`` (multimodal)          ``X``                                  text
``model.X``                                      ``X``                                  text
``lm_head.weight``                               ``lm_head.weight``                     text
``mtp.X``                                        ``mtp.X``                              mtp
``model.visual.X``                               ``visual.X``                           vision
``...mlp.experts.{e}.{gate,up,down}_proj.weight`` fused ``...mlp.experts.gate_up_proj`` /
                                                 ``...mlp.experts.down_proj``
==============================================  =====================================  ========
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ninfer.models.qwen3_5.config import ConfigError, Qwen35Config

from .errors import ConversionError

SOURCE_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_EXPERT = re.compile(r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")
_PREFIXES = (("model.language_model.", ""), ("model.visual.", "visual."), ("model.", ""))


@dataclass(frozen=True)
class SourceTensor:
    key: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name ("BF16", "F32", ...)


def logical_name(key: str) -> str | None:
    """The logical name of a checkpoint key, or None when the key has no place in a Qwen3.5 artifact."""
    if key == "lm_head.weight" or key.startswith("mtp."):
        return key
    for prefix, repl in _PREFIXES:
        if key.startswith(prefix):
            return repl + key[len(prefix):]
    return None


def expert_key(name: str) -> tuple[str, int, str] | None:
    """``layers.3.mlp.experts.7.up_proj.weight`` -> (``layers.3.mlp.experts``, 7, ``up``)."""
    m = _EXPERT.match(name)
    return (m["base"], int(m["e"]), m["proj"]) if m else None


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (names, dtypes, shapes, offsets) without touching tensor bytes."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConversionError(str(path), ["not a safetensors file (shorter than 8 bytes)"])
        (n,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConversionError(str(path), [f"corrupt safetensors header: {e}"]) from None
    header.pop("__metadata__", None)
    return header


def weight_files(src: Path) -> list[Path]:
    """``model.safetensors``, or the shards named by ``model.safetensors.index.json``."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({src / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ConversionError(str(src), [f"shard {m!r} named in model.safetensors.index.json is missing" for m in missing])
        return files
    single = src / "model.safetensors"
    if single.is_file():
        return [single]
    shards = sorted(src.glob("model-*-of-*.safetensors"))
    if shards:
        return shards
    raise ConversionError(str(src), ["no model.safetensors, model.safetensors.index.json or model-*-of-*.safetensors"])


class HFSource:
    """The tensors and config of one checkpoint directory."""

    def __init__(self, src_dir: str | Path):
        self.dir = Path(src_dir)
        if not (self.dir / "config.json").is_file():
            raise ConversionError(str(self.dir), ["config.json not found"])
        self.raw_config = json.loads((self.dir / "config.json").read_text())
        try:
            self.config = Qwen35Config.from_hf(self.raw_config)
        except ConfigError as e:
            raise ConversionError(str(self.dir), [f"config.json: {e}"]) from None
        self.files = weight_files(self.dir)
        self.tensors: dict[str, SourceTensor] = {}
        for f in self.files:
            for key, info in read_safetensors_header(f).items():
                self.tensors[key] = SourceTensor(key, f, tuple(info["shape"]), info["dtype"])
        self._handles: dict[Path, object] = {}

    def get(self, key: str):
        """One tensor as a torch tensor (read now, from a lazily opened file handle)."""
        from safetensors import safe_open

        t = self.tensors[key]
        if t.file not in self._handles:
            self._handles[t.file] = safe_open(str(t.file), framework="pt")
        return self._handles[t.file].get_tensor(key)

    def close(self) -> None:
        self._handles.clear()
