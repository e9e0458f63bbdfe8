"""Media acquisition: the image URLs of a chat request become owned bytes (`ImageData`) before the Frontend sees them.

Runs on a preparation worker (never the event loop). Sources:

- ``data:image/...;base64,...``: the encoded length is checked against the byte limit before anything is decoded.
- local files, as ``file:///abs/path`` or a plain absolute path, only with ``--allowed-local-media-path DIR``: the
  path is resolved (``..`` and every symlink followed) and must lie inside the resolved DIR; it is then opened with
  ``O_NOFOLLOW`` and must be a regular file, so a link swapped in after the check is not followed either. A
  ``file://`` URL with a host, a relative path, a query or a fragment is refused.
- ``http(s)://`` only with ``--allow-remote-media``: fetched within ``--media-fetch-timeout`` (the whole fetch), no
  redirects, and at most the byte limit read (a larger body is refused, with or without a Content-Length).

Every refusal is an APIError 400 naming the content part (``param``) and the reason.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from ninfer.frontend.media import ImageData

from .errors import APIError


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_path: Path | None = None  # resolved
    allow_remote: bool = False
    max_bytes: int = 20 << 20
    fetch_timeout: float = 10.0

    @classmethod
    def from_options(cls, options: Any) -> "MediaPolicy":
        local = options.allowed_local_media_path
        return cls(Path(os.path.realpath(local)) if local else None, options.allow_remote_media,
                   options.media_max_bytes, options.media_fetch_timeout)


def acquire_messages(messages: Any, policy: MediaPolicy) -> Any:
    """The messages with each image_url part replaced by ``{"type": "image", "image": ImageData}``; anything that is
    not a list of message objects is returned as it is (the Frontend refuses it with its own message)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        return messages
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, Sequence) or isinstance(content, (str, bytes)):
            out.append(m)
            continue
        parts = [_part(p, f"messages[{i}].content[{j}]", policy) for j, p in enumerate(content)]
        out.append({**m, "content": parts})
    return out


def _part(part: Any, where: str, policy: MediaPolicy) -> Any:
    if not isinstance(part, Mapping) or part.get("type", "text") not in ("image_url", "image"):
        return part
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{where}.image_url.url must be a non-empty string", param=where)
    return {"type": "image", "image": ImageData(fetch(url, where, policy), _label(url))}


def _label(url: str) -> str:
    return "a data URL" if url.startswith("data:") else url[:200]


def fetch(url: str, where: str, policy: MediaPolicy) -> bytes:
    """The bytes an image URL names, under the policy."""
    if url.startswith("data:"):
        return _data_url(url, where, policy.max_bytes)
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:  # e.g. an unclosed IPv6 bracket: a 400, not a traceback
        raise APIError(400, f"{where}: the image URL is malformed", param=where) from None
    if scheme in ("http", "https"):
        if not policy.allow_remote:
            raise APIError(400, f"{where}: remote image URLs are not fetched (start the server with "
                                "--allow-remote-media)", param=where)
        return _remote(url, where, policy)
    if scheme == "file" or url.startswith("/"):
        return _local(url, where, policy)
    raise APIError(400, f"{where}: unsupported image URL scheme {scheme!r} (data:, file:, http(s):)", param=where)


def _data_url(url: str, where: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64") or not head[5:].startswith("image/"):
        raise APIError(400, f"{where}: a data URL must be data:image/<type>;base64,<data>", param=where)
    if len(payload) > 4 * (max_bytes + 2) // 3 + 4:  # refused before decoding: base64 is 4 characters per 3 bytes
        raise APIError(400, f"{where}: the data URL's image is over the limit of {max_bytes} bytes "
                            "(--media-max-bytes)", param=where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: the data URL is not valid base64", param=where) from None
    if len(data) > max_bytes:
        raise APIError(400, f"{where}: the image is {len(data)} bytes, over the limit of {max_bytes} "
                            "(--media-max-bytes)", param=where)
    return data


def _local(url: str, where: str, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_path is None:
        raise APIError(400, f"{where}: local image files are not read (start the server with "
                            "--allowed-local-media-path DIR)", param=where)
    parts = urlsplit(url)
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or parts.query or parts.fragment):
        raise APIError(400, f"{where}: a file URL must be file:///absolute/path (no host, query or fragment)",
                       param=where)
    raw = unquote(parts.path) if parts.scheme == "file" else url
    if not raw.startswith("/") or "\x00" in raw:
        raise APIError(400, f"{where}: a local image path must be absolute", param=where)
    real = Path(os.path.realpath(raw))
    root = policy.allowed_local_path
    if real != root and root not in real.parents:
        raise APIError(400, f"{where}: {raw!r} is outside --allowed-local-media-path", param=where)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise APIError(400, f"{where}: cannot open {raw!r}: {e.strerror}", param=where) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise APIError(400, f"{where}: {raw!r} is not a regular file", param=where)
        data = f.read(policy.max_bytes + 1)
    if len(data) > policy.max_bytes:
        raise APIError(400, f"{where}: {raw!r} is over the limit of {policy.max_bytes} bytes (--media-max-bytes)",
                       param=where)
    return data


def _remote(url: str, where: str, policy: MediaPolicy) -> bytes:
    import httpx

    deadline = time.monotonic() + policy.fetch_timeout  # the whole fetch, not each read (a slow drip ends too)
    try:
        with httpx.Client(timeout=policy.fetch_timeout, follow_redirects=False) as client:
            with client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise APIError(400, f"{where}: fetching the image gave HTTP {r.status_code}", param=where)
                data = bytearray()
                for chunk in r.iter_bytes():
                    data += chunk
                    if time.monotonic() > deadline:
                        raise APIError(400, f"{where}: fetching the image took over {policy.fetch_timeout} s "
                                            "(--media-fetch-timeout)", param=where)
                    if len(data) > policy.max_bytes:
                        raise APIError(400, f"{where}: the remote image is over the limit of {policy.max_bytes} "
                                            "bytes (--media-max-bytes)", param=where)
                return bytes(data)
    except (httpx.HTTPError, httpx.InvalidURL) as e:  # InvalidURL is not an HTTPError (e.g. a control character)
        raise APIError(400, f"{where}: fetching the image failed: {type(e).__name__}", param=where) from None
