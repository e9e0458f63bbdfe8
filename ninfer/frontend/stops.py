"""Stop strings with holdback: text that might begin a stop string is held until it is decided.

The output never contains a stop string or anything after it. While a suffix of the text could still grow
into a stop string, it is held back; once it cannot, it is released. When several stop strings complete at
once (overlapping ones), the one starting earliest wins, so the least text is released.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=256)
def _prefix_ends(stops: tuple[str, ...]) -> frozenset[str]:
    """The characters a proper prefix of some stop string can end with: a held suffix must end with one."""
    return frozenset(s[n - 1] for s in stops for n in range(1, len(s)))


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    held: str = ""
    matched: str | None = None

    def push(self, text: str, check: bool = True) -> str:
        """Add `text`; return what is now safe to release. With check=False (before min_tokens) text passes
        straight through: a stop string counts only if it lies entirely in text produced once stops apply."""
        if self.matched is not None:
            raise RuntimeError("StopMatcher fed after a stop string matched")
        if not check or not self.stops:
            out, self.held = self.held + text, ""
            return out
        buf = self.held + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            start, stop = min(hits)
            self.matched, self.held = stop, ""
            return buf[:start]
        keep = self._holdback(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def _holdback(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        if not buf or buf[-1] not in _prefix_ends(tuple(self.stops)):  # most tokens: no suffix can match
            return 0
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        """End of output without a stop string: the held text was never a stop string, release it."""
        out, self.held = self.held, ""
        return out

    def clone(self) -> "StopMatcher":
        return StopMatcher(self.stops, self.held, self.matched)
