"""PreparedPrompt: the owning token ids of one request and their content identity.

The identity is `ninfer.contracts.token_digest` (the digest the ResourceManager and every Program use for
checkpoints): one digest of the whole prompt and one of the prefix at every explicit cache boundary (the end
of the system turn, the end of each message). The Engine's prefix index looks up the deepest boundary digest
it holds a checkpoint for; two prompts share a boundary digest exactly when they share those tokens. An image's
pads are placeholder ids derived from its content digest (`ninfer.contracts.media`), so the identity covers images.
"""

from __future__ import annotations

import array
import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ninfer.contracts.media import PromptMedia

@dataclass(frozen=True)
class PrefixDigest:
    """The digest of token_ids[:length]."""

    length: int
    digest: str


@dataclass(frozen=True)
class PreparedPrompt:
    token_ids: tuple[int, ...]
    digest: str  # of all token_ids
    boundaries: tuple[PrefixDigest, ...]  # strictly increasing lengths in 1..len(token_ids)
    reasoning_open: bool = False  # the prompt ends inside an open <think> block
    # The built-in chat renderer reproduces this prompt byte for byte, so it can tell whether an output is what the
    # next turn's history renders (the output's prefix-execution boundary, frontend/history.py).
    renders_history: bool = False
    text: str = field(default="", repr=False)  # the rendered text, for logs and /tokenize; "" for token prompts
    media: PromptMedia | None = None  # the prompt's images and MRoPE positions; None for a text prompt

    def __post_init__(self) -> None:
        lengths = [b.length for b in self.boundaries]
        if any(not 0 < n <= len(self.token_ids) for n in lengths) or lengths != sorted(set(lengths)):
            raise ValueError(f"cache boundaries {lengths} must increase strictly within 1..{len(self.token_ids)}")

    def __len__(self) -> int:
        return len(self.token_ids)

    def deepest(self, known: Iterable[str]) -> PrefixDigest | None:
        """The longest boundary whose digest is in `known` (e.g. the Engine's checkpoint index)."""
        known = set(known)
        return next((b for b in reversed(self.boundaries) if b.digest in known), None)

    def check_invariants(self) -> None:
        """Recompute every digest from the token ids: an expensive no-op when all is well."""
        fresh = digest_prefixes(self.token_ids, [b.length for b in self.boundaries])
        if fresh != (self.boundaries, self.digest):
            raise AssertionError("PreparedPrompt digests do not match its token ids")


def digest_prefixes(token_ids: Sequence[int], lengths: Sequence[int]) -> tuple[tuple[PrefixDigest, ...], str]:
    """token_digest of each prefix in `lengths` (increasing) and of the whole sequence, in one pass over the ids:
    one running hash, copied at each boundary to append that prefix's count (linear in ids plus boundaries)."""
    data = memoryview(array.array("q", token_ids).tobytes())
    running, done, out = hashlib.blake2b(digest_size=16), 0, []
    for n in (*lengths, len(token_ids)):
        running.update(data[done * 8:n * 8])
        done = n
        # Byte for byte what contracts.token_digest(tokens[:n]) hashes; tests hold the two equal.
        h = running.copy()
        h.update(n.to_bytes(8, "little"))
        out.append(PrefixDigest(n, h.hexdigest()))
    return tuple(out[:-1]), out[-1].digest


def prepare_ids(token_ids: Sequence[int], boundary_lengths: Iterable[int] = (), *, reasoning_open: bool = False,
                text: str = "", renders_history: bool = False, media: PromptMedia | None = None) -> PreparedPrompt:
    ids = tuple(int(t) for t in token_ids)
    lengths = sorted({n for n in boundary_lengths if 0 < n <= len(ids)})
    boundaries, digest = digest_prefixes(ids, lengths)
    return PreparedPrompt(ids, digest, boundaries, reasoning_open, renders_history, text, media)


def char_to_token_boundaries(offsets: Sequence[tuple[int, int]], chars: Iterable[int]) -> list[int]:
    """Token counts at which the tokenization splits exactly at each character offset in `chars`.

    A boundary falling inside a token (the BPE merged across it) has no token count and is dropped.
    """
    ends = [e for _, e in offsets]
    out = []
    for c in chars:
        k = bisect.bisect_right(ends, c)
        if k > 0 and ends[k - 1] == c and (k == len(offsets) or offsets[k][0] >= c):
            out.append(k)
    return out
