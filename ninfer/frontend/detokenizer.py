"""Incremental detokenization that never emits a broken UTF-8 sequence.

Byte-level BPE decodes by concatenating token bytes and reading them as UTF-8, invalid bytes becoming U+FFFD
(what `tokenizers` decode does). A token may end inside a multi-byte character; the incremental decoder keeps
those bytes until the character completes, so every piece of text it emits is final.
"""

from __future__ import annotations

import codecs
from .tokenizer import Qwen35Tokenizer

# GPT-2's byte <-> printable-character table of byte-level BPE.
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def _byte_decoder() -> dict[str, int]:
    bs = list(_PRINTABLE)
    cs = list(_PRINTABLE)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenTable:
    """Per token id: its bytes, and whether it is a special (control) token that skip_special_tokens drops.

    Bytes are computed on first use and kept: building all 248k entries up front costs seconds.
    """

    def __init__(self, tokenizer: Qwen35Tokenizer):
        self._raw = tokenizer.tokenizer
        self.vocab_size = tokenizer.vocab_size
        added = self._raw.get_added_tokens_decoder()
        self._pieces: dict[int, bytes] = {i: t.content.encode() for i, t in added.items()}
        self.special = frozenset(i for i, t in added.items() if t.special)
        self._bytes = _byte_decoder()

    @classmethod
    def build(cls, tokenizer: Qwen35Tokenizer) -> "TokenTable":
        return cls(tokenizer)

    @property
    def max_piece_bytes(self) -> int:
        """The most bytes one token spells: a byte-level BPE token has one character per byte; an added token's
        content is its text."""
        added = {t.content for t in self._raw.get_added_tokens_decoder().values()}
        return max(len(t.encode()) if t in added else len(t) for t in self._raw.get_vocab(with_added_tokens=True))

    def piece(self, token_id: int, skip_special: bool) -> bytes:
        if skip_special and token_id in self.special:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            token = self._raw.id_to_token(token_id) if 0 <= token_id < self.vocab_size else None
            piece = bytes(self._bytes[c] for c in token) if token else b""  # padding ids have no text
            self._pieces[token_id] = piece
        return piece


class Detokenizer:
    """Feed token ids one at a time; `push` returns the text that became final.

    The bytes of an unfinished character wait in ``_pending``: `codecs.utf_8_decode` with final=False is what
    Python's incremental UTF-8 decoder runs over its buffer, so a clone is a copy of those bytes, not a new
    decoder and its state (a clone per row per step)."""

    def __init__(self, table: TokenTable, skip_special_tokens: bool = True, pending: bytes = b""):
        self.table = table
        self.skip_special_tokens = skip_special_tokens
        self._pending = pending

    def push(self, token_id: int) -> str:
        data = self._pending + self.table.piece(token_id, self.skip_special_tokens)
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._pending = data[used:]
        return text

    def flush(self) -> str:
        """End of output: bytes of an unfinished character become U+FFFD, as a full decode would."""
        text, _ = codecs.utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        return text

    def clone(self) -> "Detokenizer":
        return Detokenizer(self.table, self.skip_special_tokens, self._pending)
