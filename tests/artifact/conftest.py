"""Fixtures for artifact tests: tiny configs and a descriptor-rewriting helper."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Callable

import pytest

from ninfer.artifact.header import HEADER_SIZE, Header
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.testing.checkpoints import tiny_config


@pytest.fixture(scope="session")
def cfg() -> Qwen35Config:
    return tiny_config()


@pytest.fixture(scope="session")
def moe_cfg() -> Qwen35Config:
    return tiny_config(moe=True)


def _rewrite_descriptor(path: Path, mutate: Callable[[dict], None] | None = None, raw: bytes | None = None) -> None:
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


@pytest.fixture()
def rewrite_descriptor():
    return _rewrite_descriptor
