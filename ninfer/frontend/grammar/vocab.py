"""The XGrammar TokenizerInfo of the Qwen3.5 vocabulary, with control tokens blanked.

`TokenizerInfo.from_huggingface` treats Qwen's added tokens (<|im_start|>, <|image_pad|>, <tool_response>, ...)
as ordinary text, so a grammar would allow them inside a JSON string (ecosystem-notes 2.2). Here every added
token gets an empty string, which XGrammar never allows in constrained text, except the reasoning and tool
markers the composed grammar matches as text. The stop tokens stay allowed where the grammar may end.
Padding ids 248077..248319 are empty too: no real token lives there.
"""

from __future__ import annotations

import xgrammar as xgr

from ..tokenizer import Qwen35Tokenizer

PADDED_VOCAB_SIZE = 248320
FIRST_ADDED_ID = 248044
# Matched as text by the composed grammar: <think>, </think>, <tool_call>, </tool_call>.
MARKER_IDS = (Qwen35Tokenizer.THINK, Qwen35Tokenizer.THINK_END, Qwen35Tokenizer.TOOL_CALL,
              Qwen35Tokenizer.TOOL_CALL_END)
STOP_IDS = (Qwen35Tokenizer.IM_END, Qwen35Tokenizer.ENDOFTEXT)


def encoded_vocab(tokenizer: Qwen35Tokenizer, vocab_size: int = PADDED_VOCAB_SIZE) -> list[str]:
    """Byte-level token strings for every id below `vocab_size`; blanked ("") ids can never be chosen."""
    raw = tokenizer.tokenizer
    vocab = [""] * vocab_size
    for token_id in range(min(tokenizer.vocab_size, vocab_size)):
        if token_id < FIRST_ADDED_ID or token_id in MARKER_IDS:
            vocab[token_id] = raw.id_to_token(token_id) or ""
    return vocab


def build_tokenizer_info(tokenizer: Qwen35Tokenizer, vocab_size: int = PADDED_VOCAB_SIZE) -> xgr.TokenizerInfo:
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"grammar vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    return xgr.TokenizerInfo(encoded_vocab(tokenizer, vocab_size), xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size,
                             stop_token_ids=list(STOP_IDS), add_prefix_space=False)
