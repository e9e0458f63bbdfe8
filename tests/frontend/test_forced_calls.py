"""Forced tool calls (`tool_choice` required or named) as a client sees them: a call cut short by max_tokens or a
stop string ends with finish_reason length and never reaches `content` as raw XML (whole or streamed), and with
thinking on the thinking budget is capped so that the forced `</think>` leaves room for the call."""

from __future__ import annotations

import json

import pytest

from corpus import TOOLS
from helpers import joined, stream
from ninfer.contracts import FinishReason
from ninfer.frontend import ChatRequest, OutputOptions
from ninfer.frontend.budget import VALUE_TOKENS, call_room

IM_END = 248046
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def open_forced(fe, choice="required", thinking=False, options=None, parallel=True):
    kwargs = None if thinking else {"enable_thinking": False}
    chat = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], TOOLS, tool_choice=choice,
                                       parallel_tool_calls=parallel, chat_template_kwargs=kwargs))
    return fe.open_session(chat.prompt, options or OutputOptions(), chat.structured)


@pytest.mark.parametrize("choice", ["required", NAMED])
@pytest.mark.parametrize("cut", [3, 9, len("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n")])
def test_a_call_cut_by_max_tokens_is_length_and_never_content(fe, choice, cut):
    ids = fe.tokenizer.encode(CALL)
    n = len(fe.tokenizer.encode(CALL[:cut])) if cut > 9 else cut
    s = open_forced(fe, choice, options=OutputOptions(max_tokens=n))
    chunks, _ = stream(s, ids)
    r = s.result()
    assert (r.finish_reason, r.content, r.tool_calls) == (FinishReason.LENGTH, "", ())
    assert joined(chunks) == ("", "", []) and "dropped" in r.issues[0]
    assert r.as_openai_message()["content"] is None


def test_a_call_spelled_in_pieces_and_cut_inside_its_marker_leaks_nothing(fe):
    pieces = [t for c in ("<", "tool") for t in fe.tokenizer.encode(c)]
    s = open_forced(fe, options=OutputOptions(max_tokens=len(pieces)))
    chunks, _ = stream(s, pieces)
    assert (s.result().content, s.result().finish_reason) == ("", FinishReason.LENGTH)
    assert joined(chunks)[0] == ""


def test_a_call_cut_by_a_stop_string_is_length_too(fe):
    s = open_forced(fe, options=OutputOptions(stop=("Par",)))
    stream(s, fe.tokenizer.encode(CALL))
    r = s.result()
    assert (r.finish_reason, r.content, r.tool_calls, r.stop_reason) == (FinishReason.LENGTH, "", (), "Par")


def test_complete_calls_before_the_cut_are_kept(fe):
    ids = fe.tokenizer.encode(CALL + "\n" + CALL)
    s = open_forced(fe, options=OutputOptions(max_tokens=len(fe.tokenizer.encode(CALL + "\n<tool_call>\n<f"))))
    chunks, _ = stream(s, ids)
    r = s.result()
    assert r.finish_reason is FinishReason.LENGTH and r.content == ""
    assert [json.loads(c.arguments) for c in r.tool_calls] == [{"city": "Paris"}]
    assert [c["name"] for c in joined(chunks)[2]] == ["get_weather"]


def test_unconstrained_auto_keeps_an_unterminated_call_as_content(fe):
    chat = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], TOOLS,
                                       chat_template_kwargs={"enable_thinking": False}))
    s = fe.open_session(chat.prompt, OutputOptions(max_tokens=6), chat.structured)
    assert s.grammar is None  # auto without strict tools: the model's text, parsed afterwards
    stream(s, fe.tokenizer.encode(CALL))
    assert s.result().content.startswith("<tool_call>") and s.result().finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_thinking_budget_is_capped_so_the_forced_call_fits(fe, choice):
    max_tokens = 120
    s = open_forced(fe, choice, thinking=True, options=OutputOptions(max_tokens=max_tokens), parallel=False)
    suffix = fe.think_end_suffix
    room = call_room([t for t in s.options.tools], fe.tokenizer)
    assert room >= VALUE_TOKENS and s.options.thinking_budget == max_tokens - len(suffix) - room
    word = fe.tokenizer.encode(" hmm")
    while s.control_suffix() is None:
        s.commit(s.preview(word))
        assert s.generated < max_tokens, "reasoning ran past the capped budget"
    s.commit(s.preview(s.control_suffix(), forced=True))
    stream(s, fe.tokenizer.encode(CALL) + [IM_END])
    r = s.result()
    assert r.finish_reason is FinishReason.TOOL_CALLS and r.completion_tokens <= max_tokens
    assert r.reasoning.strip().startswith("hmm") and r.content == ""


def test_a_smaller_requested_budget_wins_and_unforced_requests_keep_theirs(fe):
    s = open_forced(fe, thinking=True, options=OutputOptions(max_tokens=200, thinking_budget=5))
    assert s.options.thinking_budget == 5
    s = open_forced(fe, thinking=True, options=OutputOptions(max_tokens=8))
    assert s.options.thinking_budget == 0  # no room for a call: reasoning ends at once
    chat = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], TOOLS))
    assert fe.open_session(chat.prompt, OutputOptions(max_tokens=50), chat.structured).options.thinking_budget is None
    s = open_forced(fe, thinking=False, options=OutputOptions(max_tokens=50))
    assert s.options.thinking_budget is None  # thinking off: nothing to cap
