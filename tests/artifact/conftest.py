"""Fixtures for artifact tests: a tiny config, random logical tensors, and a descriptor-rewriting helper."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Callable

import pytest
import torch

from ninfer.artifact.header import HEADER_SIZE, Header
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import logical_parameters
from ninfer.testing.checkpoints import tiny_text_config


def make_cfg(**kw) -> Qwen35Config:
    raw = dict(tiny_text_config(**kw), model_type="qwen3_5_moe_text" if kw.get("moe") else "qwen3_5_text",
               mtp_num_hidden_layers=1)
    return Qwen35Config.from_hf(raw)


def random_tensors(cfg: Qwen35Config, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                   features=("text", "mtp")) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s.shape, generator=g).to(torch.float32 if s.kind == "fp32" else dtype)
            for n, s in logical_parameters(cfg, features).items()}


@pytest.fixture(scope="session")
def cfg() -> Qwen35Config:
    return make_cfg()


@pytest.fixture(scope="session")
def moe_cfg() -> Qwen35Config:
    return make_cfg(moe=True)


def rewrite_descriptor(path: Path, mutate: Callable[[dict], None] | None = None, raw: bytes | None = None) -> None:
    """Replace a file's descriptor (mutated JSON, or raw bytes) and fix up the header so only the content is wrong."""
    data = bytearray(path.read_bytes())
    h = Header.unpack(bytes(data[:HEADER_SIZE]), len(data))
    if raw is None:
        d = json.loads(bytes(data[h.descriptor_offset: h.descriptor_offset + h.descriptor_length]))
        mutate(d)
        raw = json.dumps(d).encode()
    new = Header(h.data_offset, h.descriptor_offset, len(raw), zlib.crc32(raw), h.descriptor_offset + len(raw))
    out = bytes(data[: h.descriptor_offset]) + raw
    path.write_bytes(new.pack() + out[HEADER_SIZE:])
