"""An HF Qwen3.5 checkpoint directory as a lazy source of tensors under ninfer's logical names.

Only safetensors headers are read up front (names, shapes, dtypes, offsets); tensor bytes are read when the writer
asks for them, with plain positioned reads rather than ``safe_open``'s memory map: mapped pages stay resident (and
count in RSS) until the file is closed, which would grow the converter's footprint to whole shards. A tensor kept in
its dtype is streamed in 16 MiB chunks, and a cast one is cast chunk by chunk, so peak memory stays near one chunk.
Key mapping:

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
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ninfer.models.qwen3_5.config import ConfigError, Qwen35Config

from .errors import ConversionError

SOURCE_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
# numpy views of the file dtypes (bf16 and fp8 as unsigned bits, numpy has neither).
NUMPY_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I8": np.int8, "U8": np.uint8,
                "I16": np.int16, "I32": np.int32, "I64": np.int64, "F8_E4M3": np.uint8}
CHUNK = 16 << 20
_EXPERT = re.compile(r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")
_PREFIXES = (("model.language_model.", ""), ("model.visual.", "visual."), ("model.", ""))


@dataclass(frozen=True)
class SourceTensor:
    key: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name ("BF16", "F32", ...)
    start: int  # absolute byte offset of the data in the file
    nbytes: int


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


def read_safetensors_header(path: Path) -> list[SourceTensor]:
    """The tensors of a safetensors file (names, dtypes, shapes, byte ranges) without touching tensor bytes."""
    size = path.stat().st_size
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
    out = []
    for key, info in header.items():
        shape, dtype, (begin, end) = tuple(info["shape"]), info["dtype"], info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * ITEMSIZE.get(dtype, 0) or 8 + n + end > size:
            raise ConversionError(str(path), [f"tensor {key!r}: byte range [{begin}, {end}) does not hold "
                                              f"{dtype} {list(shape)} inside a file of {size} bytes"])
        out.append(SourceTensor(key, path, shape, dtype, 8 + n + begin, end - begin))
    return out


def weight_files(src: Path) -> list[Path]:
    """``model.safetensors``, or the shards named by ``model.safetensors.index.json``."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({src / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ConversionError(str(src), [f"shard {m!r} named in model.safetensors.index.json is missing"
                                             for m in missing])
        return files
    single = src / "model.safetensors"
    if single.is_file():
        return [single]
    shards = sorted(src.glob("model-*-of-*.safetensors"))
    if shards:
        return shards
    raise ConversionError(str(src), ["no model.safetensors, model.safetensors.index.json or model-*-of-*.safetensors"])


def read_config_json(src: Path) -> dict:
    """A checkpoint directory's ``config.json``; a missing or unparsable one is a ConversionError."""
    if not (src / "config.json").is_file():
        raise ConversionError(str(src), ["config.json not found"])
    try:
        return json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(str(src), [f"config.json is not valid JSON: {e}"]) from None


class HFSource:
    """The tensors and config of one checkpoint directory."""

    def __init__(self, src_dir: str | Path):
        self.dir = Path(src_dir)
        self.raw_config = read_config_json(self.dir)
        try:
            self.config = Qwen35Config.from_hf(self.raw_config)
        except ConfigError as e:
            raise ConversionError(str(self.dir), [f"config.json: {e}"]) from None
        except (TypeError, ValueError, AttributeError) as e:
            # a field of the wrong type (a string where a number belongs, a list where an object belongs)
            raise ConversionError(str(self.dir), [f"config.json has a malformed field: {e}"]) from None
        self.files = weight_files(self.dir)
        self.tensors: dict[str, SourceTensor] = {}
        for f in self.files:
            for t in read_safetensors_header(f):
                self.tensors[t.key] = t
        self._fds: dict[Path, int] = {}
        self._buf = bytearray(CHUNK)

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def _read_into(self, t: SourceTensor, dst: memoryview, pos: int) -> None:
        n = os.preadv(self._fd(t.file), [dst], t.start + pos)
        if n != len(dst):
            raise ConversionError(str(t.file), [f"tensor {t.key!r}: short read ({n} of {len(dst)} bytes)"])

    def get(self, key: str) -> torch.Tensor:
        """One tensor, read whole into a fresh buffer."""
        t = self.tensors[key]
        buf = torch.empty(t.nbytes, dtype=torch.uint8)
        if t.nbytes:
            self._read_into(t, memoryview(buf.numpy()), 0)
        return buf.view(getattr(torch, SOURCE_DTYPES[t.dtype])).reshape(t.shape)

    def array(self, key: str) -> np.ndarray:
        """One tensor's bytes as a numpy array of its file dtype (BF16 as uint16 bits, F8_E4M3 as uint8 bits)."""
        t = self.tensors[key]
        buf = np.empty(t.nbytes, dtype=np.uint8)
        if t.nbytes:
            self._read_into(t, memoryview(buf), 0)
        return buf.view(NUMPY_DTYPES[t.dtype]).reshape(t.shape)

    def chunks(self, key: str, dtype: str) -> Iterator[memoryview | torch.Tensor]:
        """The tensor's bytes in ``dtype``, 16 MiB of source at a time (cast chunk by chunk when the dtypes differ).

        Chunks share one buffer: consume each before asking for the next.
        """
        t = self.tensors[key]
        src_dtype = getattr(torch, SOURCE_DTYPES[t.dtype])
        target = getattr(torch, dtype)
        view = memoryview(self._buf)
        for pos in range(0, t.nbytes, CHUNK):
            n = min(CHUNK, t.nbytes - pos)  # CHUNK is a multiple of every itemsize, so chunks hold whole elements
            self._read_into(t, view[:n], pos)
            if src_dtype == target:
                yield view[:n]
            else:
                yield torch.frombuffer(self._buf, dtype=src_dtype, count=n // ITEMSIZE[t.dtype]).to(target)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
