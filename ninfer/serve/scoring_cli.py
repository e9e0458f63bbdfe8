"""`ninfer score`: JSONL in, one JSON line out per input line, through the CausalScoring core.

Input lines are {"text": "..."} or {"tokens": [ids]} (any other keys, e.g. an "id", are copied to the output).
Output: tokens, token strings, logprobs (null for the first token: it has no prefix), greedy flags, the total and
the token count scored. A bad line gets an "error" field and scoring goes on.
"""

from __future__ import annotations

import json
from typing import TextIO

from ninfer.contracts import RequestRejected
from ninfer.wiring import Runtime

from .requests import TokenText


def score_line(rt: Runtime, line: str) -> dict:
    record = json.loads(line)
    if not isinstance(record, dict) or ("text" in record) == ("tokens" in record):
        raise ValueError('each line must be a JSON object with exactly one of "text" and "tokens"')
    tok = rt.frontend.tokenizer
    if "text" in record:
        if not isinstance(record["text"], str) or not record["text"]:
            raise ValueError('"text" must be a non-empty string')
        tokens = tok.encode(record.pop("text"))
    else:
        tokens = record.pop("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError('"tokens" must be a list of token ids')
    result = rt.scorer.score(tokens, vocab_size=tok.vocab_size)
    text = TokenText(rt.frontend)
    return {**record, "tokens": list(tokens), "token_strs": [text.text(t) for t in tokens],
            "logprobs": [None, *result.logprobs], "greedy": [None, *result.greedy],
            "total_logprob": sum(result.logprobs), "scored_tokens": len(result.logprobs),
            "all_greedy": all(result.greedy), "windows": result.windows}


def score_lines(rt: Runtime, source: TextIO, sink: TextIO) -> int:
    """Score every non-blank line; returns how many failed."""
    failed = 0
    for number, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            out = score_line(rt, line)
        except (ValueError, RequestRejected) as e:
            failed += 1
            out = {"line": number, "error": getattr(e, "message", None) or str(e)}
        sink.write(json.dumps(out, ensure_ascii=False) + "\n")
        sink.flush()
    return failed
