"""`ninfer bench serve`'s summary: the speculative section appears only when the server reported drafts."""

from __future__ import annotations

from ninfer.serve.bench import RequestRecord, format_summary, summarize


def _record(drafted: int, accepted: int, rounds: list[int] | None = None) -> RequestRecord:
    return RequestRecord(ok=True, ttft=0.01, e2el=0.1, output_tokens=8, prompt_tokens=4, draft_tokens=drafted,
                         accepted_draft_tokens=accepted, acceptance_lengths=rounds or [])


def test_speculative_counts_are_summed_and_printed():
    s = summarize([_record(9, 3), _record(6, 6)], duration=1.0)
    assert (s["draft_tokens"], s["accepted_draft_tokens"]) == (15, 9) and s["draft_acceptance_rate"] == 0.6
    text = format_summary(s)
    assert "Accepted draft tokens:" in text and "60.00" in text
    assert "acceptance_histogram" not in s and "Mean acceptance length" not in text  # no rounds reported


def test_acceptance_histogram_is_summed_and_printed():
    # rounds emitting 1, 2, 4 tokens (4 drafts accepted) and 2 rounds emitting 2 (2 accepted): unequal lengths
    s = summarize([_record(9, 4, [1, 1, 0, 1]), _record(6, 2, [0, 2])], duration=1.0)
    assert s["acceptance_histogram"] == [1, 3, 0, 1]
    assert s["mean_acceptance_length"] == 11 / 5  # (1 + 2 * 3 + 4) tokens over 5 rounds
    assert s["acceptance_per_position"] == [4 / 5, 1 / 5, 1 / 5]
    text = format_summary(s)
    assert "Mean acceptance length:                 2.20" in text
    assert "Per-position acceptance (%):            80.0, 20.0, 20.0" in text
    assert "Rounds emitting 2 token(s):             3" in text


def test_no_speculative_section_without_drafts():
    s = summarize([_record(0, 0)], duration=1.0)
    assert "draft_tokens" not in s and "Speculative" not in format_summary(s)
