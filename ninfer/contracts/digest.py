"""Content identity of a token prefix, shared by the Frontend, the ResourceManager and every Program.

A checkpoint at frontier t is reusable for a prompt exactly when the digest of the prompt's first t tokens equals
the checkpoint's digest, so the ResourceManager never needs the token lists themselves.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence


def token_digest(tokens: Sequence[int]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(len(tokens).to_bytes(8, "little"))
    h.update(array("q", tokens).tobytes())
    return h.hexdigest()
