"""`ninfer bench serve`'s summary: the speculative section appears only when the server reported drafts."""

from __future__ import annotations

from ninfer.serve.bench import RequestRecord, format_summary, summarize


def _record(drafted: int, accepted: int) -> RequestRecord:
    return RequestRecord(ok=True, ttft=0.01, e2el=0.1, output_tokens=8, prompt_tokens=4, draft_tokens=drafted,
                         accepted_draft_tokens=accepted)


def test_speculative_counts_are_summed_and_printed():
    s = summarize([_record(9, 3), _record(6, 6)], duration=1.0)
    assert (s["draft_tokens"], s["accepted_draft_tokens"]) == (15, 9) and s["draft_acceptance_rate"] == 0.6
    text = format_summary(s)
    assert "Accepted draft tokens:" in text and "60.00" in text


def test_no_speculative_section_without_drafts():
    s = summarize([_record(0, 0)], duration=1.0)
    assert "draft_tokens" not in s and "Speculative" not in format_summary(s)
