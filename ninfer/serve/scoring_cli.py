"""`ninfer score`: JSONL in, one JSON line out per input line, through the CausalScoring core.

Input lines are {"text": "..."} or {"tokens": [ids]} (any other keys, e.g. an "id", are copied to the output).
Output: tokens, token strings, logprobs (null for the first token: it has no prefix), greedy flags, the total and
the token count scored. A bad line gets an "error" field and scoring goes on; at the end each failed line is named
on stderr with its reason, and the command exits 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from ninfer.contracts import RequestRejected
from ninfer.errors import NinferError, NotFoundError, UsageError
from ninfer.frontend.input_bounds import MAX_JSON_DEPTH, too_deep
from ninfer.runtime import Runtime

from .requests import TokenText


def _parse(line: str) -> object:
    """One input line's JSON, refused with the reason when nested too deeply or holding text UTF-8 cannot encode."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:  # past the parser's own limit
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    if too_deep(record):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode: a lone surrogate U+{ord(e.object[e.start]):04X}") from None
    return record


def score_line(rt: Runtime, line: str) -> dict:
    record = _parse(line)
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


@dataclass(frozen=True)
class LineFailure:
    line: int  # 1-based line number in the input
    reason: str


class ScoringFailed(NinferError):
    """Some input lines could not be scored (each is named on stderr and has an "error" field in the output)."""


def split_score_words(words: tuple[str, ...]) -> tuple[str | None, str]:
    """(model or None, input path or "-") from `ninfer score [MODEL] [INPUT]`: a lone word is the model when it
    names a directory or a .ninfer file, else the input."""
    if len(words) > 2:
        raise UsageError(f"expected [MODEL] [INPUT], got {len(words)} words").locate("ninfer score")
    if len(words) == 2:
        model, source = words
    elif len(words) == 1 and (Path(words[0]).is_dir() or words[0].endswith(".ninfer")):
        model, source = words[0], "-"
    else:
        model, source = None, words[0] if words else "-"
    if source != "-" and not Path(source).is_file():
        raise NotFoundError("no such input file").locate(source, hint="pass a JSONL file, or - for stdin")
    return model, source


def score_lines(rt: Runtime, source: TextIO, sink: TextIO) -> list[LineFailure]:
    """Score every non-blank line; returns the lines that failed, with why."""
    failures: list[LineFailure] = []
    for number, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            out = score_line(rt, line)
        except (ValueError, RequestRejected) as e:
            failures.append(LineFailure(number, getattr(e, "message", None) or str(e)))
            out = {"line": number, "error": failures[-1].reason}
        sink.write(json.dumps(out, ensure_ascii=False) + "\n")
        sink.flush()
    return failures


def report_failures(failures: list[LineFailure], echo: Callable[[str], None]) -> None:
    """Name each failed line and its reason, then fail the command."""
    for f in failures:
        echo(f"line {f.line}: {f.reason}")
    if failures:
        raise ScoringFailed(f"{len(failures)} line(s) could not be scored (listed above; each output line has an "
                            "\"error\" field)")
