"""Media acquisition: the image URLs of a chat request become owned bytes (`ImageData`) before the Frontend sees them.

Runs on a preparation worker (never the event loop). Sources:

- ``data:image/...;base64,...``: the encoded length is checked against the byte limit before anything is decoded.
- local files, as ``file:///abs/path`` or a plain absolute path, only with ``--allowed-local-media-path DIR``: the
  path is resolved (``..`` and every symlink followed) and must lie inside the resolved DIR; it is then opened with
  ``O_NOFOLLOW`` and must be a regular file, so a link swapped in after the check is not followed either. A
  ``file://`` URL with a host, a relative path, a query or a fragment is refused.
- ``http(s)://`` only with ``--allow-remote-media``: fetched within ``--media-fetch-timeout`` (the whole fetch), no
  redirects, and at most the byte limit read (a larger body is refused, with or without a Content-Length). The
  fetch runs on a thread of its own while the preparation worker watches the request: a client that leaves (the
  preparation pool's cancel event, ``cancellable``) or the timeout ends the wait at once, and the fetch stops at its
  next chunk (a stalled read ends within the timeout), its bytes dropped.

The image parts are counted before anything is fetched: a request with more than ``--limit-mm-per-prompt`` images,
or with any when the server takes none, is refused without a fetch. Every refusal is an APIError 400 naming the
content part (``param``) and the reason (499 for a client that left).
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from ninfer.frontend.grammar.workers import current_cancel
from ninfer.frontend.media import ImageData

from .errors import APIError, host_overloaded

CANCEL_POLL_S = 0.05  # how often a waiting remote fetch looks at its request's cancel event and deadline


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_path: Path | None = None  # resolved
    allow_remote: bool = False
    max_bytes: int = 20 << 20
    fetch_timeout: float = 10.0
    max_images: int = 8  # per request (--limit-mm-per-prompt)
    refusal: str | None = None  # why this server takes no images at all (the Frontend's reason), None: it does

    @classmethod
    def from_options(cls, options: Any, refusal: str | None = None) -> "MediaPolicy":
        local = options.allowed_local_media_path
        return cls(Path(os.path.realpath(local)) if local else None, options.allow_remote_media,
                   options.media_max_bytes, options.media_fetch_timeout, options.limit_mm_per_prompt, refusal)

    @classmethod
    def of_runtime(cls, rt: Any) -> "MediaPolicy":
        """The policy of a running server: its options, and its Frontend's reason when it takes no images."""
        fe = rt.frontend
        return cls.from_options(rt.options, None if fe.vision is not None else fe.no_vision)


def acquire_messages(messages: Any, policy: MediaPolicy) -> Any:
    """The messages with each image_url part replaced by ``{"type": "image", "image": ImageData}``; anything that is
    not a list of message objects is returned as it is (the Frontend refuses it with its own message)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        return messages
    _check_count(messages, policy)
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, Sequence) or isinstance(content, (str, bytes)):
            out.append(m)
            continue
        parts = [_part(p, f"messages[{i}].content[{j}]", policy) for j, p in enumerate(content)]
        out.append({**m, "content": parts})
    return out


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type", "text") in ("image_url", "image")


def _check_count(messages: Sequence, policy: MediaPolicy) -> None:
    """Refuse, before any fetch, a request with images when none are taken, or with too many."""
    wheres = [f"messages[{i}].content[{j}]" for i, m in enumerate(messages)
              if isinstance(m, Mapping) and isinstance(m.get("content"), Sequence)
              and not isinstance(m.get("content"), (str, bytes))
              for j, p in enumerate(m["content"]) if _is_image(p)]
    if wheres and policy.refusal is not None:
        raise APIError(400, f"{wheres[0]} is an image part; {policy.refusal}", param=wheres[0])
    if len(wheres) > policy.max_images:
        where = wheres[policy.max_images]
        raise APIError(400, f"{len(wheres)} images in one request, over the limit of {policy.max_images} "
                            "(--limit-mm-per-prompt)", param=where)


def _part(part: Any, where: str, policy: MediaPolicy) -> Any:
    if not _is_image(part):
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
    """The fetch on its own thread; this one waits for it, the request's cancel event and the whole-fetch
    deadline, whichever comes first."""
    cancel, deadline = current_cancel(), time.monotonic() + policy.fetch_timeout
    fetch = _Fetch(url, where, policy, deadline)
    try:
        threading.Thread(target=fetch.run, name="ninfer-media-fetch", daemon=True).start()
    except RuntimeError as e:  # can't start new thread: the host's overload, not the request's
        raise host_overloaded("a media fetch", e) from None
    while not fetch.done.wait(CANCEL_POLL_S):
        if cancel is not None and cancel.is_set():
            fetch.stop.set()
            raise APIError(499, "client disconnected", code="client_closed")
        if time.monotonic() > deadline:
            fetch.stop.set()
            raise fetch.too_slow()
    if fetch.error is not None:
        raise fetch.error
    return fetch.data


class _Fetch:
    """One remote image fetch, run on its own thread: ``data`` or ``error`` once ``done`` is set. Once ``stop`` is
    set (the request went away or ran out of time) it reads no further chunk; a read that is stalled ends within
    the fetch timeout (httpx's per-read timeout), so the thread never outlives the request by more than that."""

    def __init__(self, url: str, where: str, policy: MediaPolicy, deadline: float):
        self.url, self.where, self.policy, self.deadline = url, where, policy, deadline
        self.done, self.stop = threading.Event(), threading.Event()
        self.data: bytes = b""
        self.error: APIError | None = None

    def too_slow(self) -> APIError:
        return APIError(400, f"{self.where}: fetching the image took over {self.policy.fetch_timeout} s "
                             "(--media-fetch-timeout)", param=self.where)

    def run(self) -> None:
        try:
            self.data = self._get()
        except APIError as e:
            self.error = e
        finally:
            self.done.set()

    def _get(self) -> bytes:
        import httpx

        where, policy = self.where, self.policy
        try:
            with httpx.Client(timeout=policy.fetch_timeout, follow_redirects=False) as client:
                with client.stream("GET", self.url) as r:
                    if r.status_code != 200:
                        raise APIError(400, f"{where}: fetching the image gave HTTP {r.status_code}", param=where)
                    data = bytearray()
                    for chunk in r.iter_bytes():
                        data += chunk
                        if self.stop.is_set() or time.monotonic() > self.deadline:
                            raise self.too_slow()  # or abandoned: nobody reads this error then
                        if len(data) > policy.max_bytes:
                            raise APIError(400, f"{where}: the remote image is over the limit of "
                                                f"{policy.max_bytes} bytes (--media-max-bytes)", param=where)
                    return bytes(data)
        except (httpx.HTTPError, httpx.InvalidURL) as e:  # InvalidURL is not an HTTPError (a control character)
            raise APIError(400, f"{where}: fetching the image failed: {type(e).__name__}", param=where) from None
