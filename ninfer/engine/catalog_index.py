"""The ResourceManager's prefix candidate index: frontier length -> digest of the tokens before it -> checkpoints,
plus a bounded memory of deleted ones (so a miss can say it was caused by an eviction).

A lookup digests the prompt once per distinct frontier length, deepest first, and stops at the first length that
holds a device-resident checkpoint (`token_digest(prompt[:n])` is the resident prefix identity every Program reports).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Mapping

from ninfer.contracts import CheckpointId, CheckpointInfo, token_digest

DELETED_MEMORY = 4096  # deleted (length, digest) pairs remembered for miss causes
DELETED_PROBES = 32  # deepest remembered lengths a miss digests the prompt at


class PrefixIndex:
    def __init__(self) -> None:
        self.by_length: dict[int, dict[str, set[CheckpointId]]] = {}
        self._deleted: OrderedDict[tuple[int, str], None] = OrderedDict()

    def add(self, info: CheckpointInfo) -> None:
        self.by_length.setdefault(info.tokens, {}).setdefault(info.digest, set()).add(info.id)
        self._deleted.pop((info.tokens, info.digest), None)

    def remove(self, info: CheckpointInfo, *, deleted: bool) -> None:
        same = self.by_length[info.tokens]
        same[info.digest].discard(info.id)
        if not same[info.digest]:
            del same[info.digest]
        if not same:
            del self.by_length[info.tokens]
        if deleted:
            self._deleted[(info.tokens, info.digest)] = None
            while len(self._deleted) > DELETED_MEMORY:
                self._deleted.popitem(last=False)

    def deepest(self, prompt: tuple[int, ...], floor: int = 0) -> set[CheckpointId]:
        """Checkpoints at the deepest frontier n with floor < n < len(prompt) whose tokens are prompt[:n]."""
        return next(self.matches(prompt, floor, len(prompt)), set())

    def matches(self, prompt: tuple[int, ...], lo: int, hi: int) -> Iterator[set[CheckpointId]]:
        """Checkpoints whose tokens are prompt[:n], per frontier lo < n < min(hi, len(prompt)), deepest first; the
        prompt is digested lazily, once per frontier length reached."""
        hi = min(hi, len(prompt))
        for n in sorted((n for n in self.by_length if lo < n < hi), reverse=True):
            ids = self.by_length[n].get(token_digest(prompt[:n]))
            if ids:
                yield ids

    def holds(self, prompt: tuple[int, ...], n: int) -> bool:
        """A checkpoint of prompt[:n] is already published."""
        same = self.by_length.get(n)
        return bool(same) and token_digest(prompt[:n]) in same

    def was_deleted(self, prompt: tuple[int, ...]) -> bool:
        """A deleted checkpoint was a strict prefix of the prompt (probing the deepest remembered lengths)."""
        lengths = sorted({n for n, _ in self._deleted if n < len(prompt)}, reverse=True)[:DELETED_PROBES]
        return any((n, token_digest(prompt[:n])) in self._deleted for n in lengths)

    def check(self, catalog: Mapping[CheckpointId, object]) -> None:
        indexed = {c for same in self.by_length.values() for ids in same.values() for c in ids}
        assert indexed == set(catalog), "prefix index and catalog disagree"
        for n, same in self.by_length.items():
            for digest, ids in same.items():
                for c in ids:
                    info = catalog[c].info  # type: ignore[attr-defined]
                    assert info.tokens == n and info.digest == digest, f"checkpoint {c.value} indexed wrongly"
