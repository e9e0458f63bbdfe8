"""The fixed 64-byte header at the start of every ``.ninfer`` file.

Layout (little-endian)::

    0   8s  magic            b"NINFER\\0\\3"
    8   u32 version          3
    12  u32 header_size      64
    16  u64 data_offset      first object byte (= ALIGN)
    24  u64 descriptor_offset
    32  u64 descriptor_length
    40  u32 descriptor_crc32
    44  u32 alignment        object alignment (4096)
    48  u64 file_size
    56  8x  reserved (zero)

The writer leaves the header zeroed until every object and the descriptor are on disk, so an interrupted write can
never carry a valid magic.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import ArtifactError

MAGIC = b"NINFER\x00\x03"
VERSION = 3
HEADER_SIZE = 64
ALIGN = 4096
_STRUCT = struct.Struct("<8sIIQQQIIQ8x")
assert _STRUCT.size == HEADER_SIZE


@dataclass(frozen=True)
class Header:
    data_offset: int
    descriptor_offset: int
    descriptor_length: int
    descriptor_crc32: int
    file_size: int
    alignment: int = ALIGN
    version: int = VERSION

    def pack(self) -> bytes:
        return _STRUCT.pack(MAGIC, self.version, HEADER_SIZE, self.data_offset, self.descriptor_offset,
                            self.descriptor_length, self.descriptor_crc32, self.alignment, self.file_size)

    @classmethod
    def unpack(cls, raw: bytes, actual_size: int) -> "Header":
        """Parse and check the header against the real file size."""
        if len(raw) < HEADER_SIZE:
            raise ArtifactError("header", "file too short", f"{actual_size} bytes, the header alone is {HEADER_SIZE}")
        magic, version, hsize, data_off, d_off, d_len, d_crc, align, fsize = _STRUCT.unpack(raw[:HEADER_SIZE])
        if magic[:6] != MAGIC[:6]:
            raise ArtifactError("header.magic", "not a .ninfer file", repr(magic))
        if magic != MAGIC or version != VERSION:
            raise ArtifactError("header.version", "unsupported container version",
                                f"magic {magic!r}, version {version}; this reader reads version {VERSION}")
        if hsize != HEADER_SIZE:
            raise ArtifactError("header.header_size", "unexpected value", str(hsize))
        if fsize != actual_size:
            raise ArtifactError("header.file_size", "file size mismatch (truncated or extended file)",
                                f"header says {fsize} bytes, file has {actual_size}")
        if align <= 0 or align & (align - 1) or data_off % align or data_off < HEADER_SIZE:
            raise ArtifactError("header.alignment", "invalid alignment or data offset", f"{align}, {data_off}")
        if d_off < data_off or d_off + d_len > actual_size or d_len == 0:
            raise ArtifactError("header.descriptor_offset", "descriptor outside the file",
                                f"[{d_off}, {d_off + d_len}) in a file of {actual_size} bytes")
        return cls(data_off, d_off, d_len, d_crc, fsize, align, version)
