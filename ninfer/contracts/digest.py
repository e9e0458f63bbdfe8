"""Content identity of a token prefix, shared by the Frontend, the ResourceManager and every Program.

A checkpoint at frontier t is reusable for a prompt exactly when the digest of the prompt's first t tokens equals
the checkpoint's digest, so the ResourceManager never needs the token lists themselves.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence


def token_digest(tokens: Sequence[int]) -> str:
    # The ids first, their count last: every prefix digest of one prompt then continues one running hash, so a
    # prompt's boundary digests cost one pass over its ids (frontend.prompt.digest_prefixes), not one per boundary.
    h = hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16)
    h.update(len(tokens).to_bytes(8, "little"))
    return h.hexdigest()
