"""OutputSession: channels, tool calls, preview/commit ownership, forced thinking control. Real vocabulary."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corpus import TOOLS, call
from helpers import generated_text, joined, stream
from ninfer.contracts import EngineFailure, FinishReason
from ninfer.frontend import ChatRequest, OutputOptions
from ninfer.frontend.messages import normalize_chat
from ninfer.frontend.render import split_reasoning

IM_END = 248046


def open_chat(fe, tools=TOOLS, thinking=True, options=None, **request):
    kwargs = None if thinking else {"enable_thinking": False}
    prepared = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], tools, chat_template_kwargs=kwargs,
                                           **request))
    return fe.open_session(prepared.prompt, options or OutputOptions(), prepared.structured)


def check_round_trip(fe, message, sizes=None, thinking=True):
    ids = fe.tokenizer.encode(generated_text(message, thinking))
    s = open_chat(fe, thinking=thinking)
    chunks, taken = stream(s, ids, sizes)
    text, reasoning, calls = joined(chunks)
    r = s.result()
    want_reasoning, want_content = split_reasoning(message)
    assert (r.content, r.reasoning) == (text, reasoning) == (want_content, want_reasoning if thinking else "")
    want_calls = [c["function"] for c in normalize_chat([{"role": "user", "content": "q"}, message]).messages[1]
                  .get("tool_calls", [])]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
           [(c["name"], c["arguments"]) for c in want_calls]
    assert [c.arguments for c in r.tool_calls] == [c["arguments"] for c in calls]
    assert r.finish_reason is (FinishReason.TOOL_CALLS if want_calls else FinishReason.STOP)
    assert taken == ids and r.completion_tokens == len(ids) and not r.issues
    return r


def test_reasoning_content_and_parallel_calls_round_trip(fe):
    msg = {"role": "assistant", "content": "Checking ü 毕.", "reasoning_content": "Think\nabout it.",
           "tool_calls": [call("get_weather", city="Paris", days=3, metric=True, hours=[1, 2], opts={"a": [1]}),
                          call("search", query="x < y", top_k=2.5)]}
    r = check_round_trip(fe, msg)
    assert r.reasoning_tokens >= 4 and r.tool_calls[0].id != r.tool_calls[1].id
    check_round_trip(fe, msg, sizes=[3, 7, 1, 16, 2, 50, 50])


def test_thinking_off_is_all_content(fe):
    r = check_round_trip(fe, {"role": "assistant", "content": "Plain <think> answer"}, thinking=False)
    assert r.reasoning_tokens == 0


_words = st.lists(st.sampled_from(["a", "b c", " ", "\n", "毕", "😀", "<", ">", "=", "/", "think", "x1"]),
                  min_size=1, max_size=8).map("".join).map(str.strip).filter(bool)
_typed = {"city": _words, "days": st.integers(-99, 99), "metric": st.booleans(),
          "hours": st.lists(st.integers(0, 9), max_size=3),
          "opts": st.dictionaries(st.sampled_from("kv"), st.integers(0, 3), max_size=2)}


@st.composite
def assistant_messages(draw):
    args = {k: draw(values) for k, values in _typed.items() if draw(st.booleans())}
    calls = [call("get_weather", **args)] if draw(st.booleans()) else []
    msg = {"role": "assistant", "content": draw(st.one_of(st.just(""), _words)),
           "reasoning_content": draw(_words)}
    if calls:
        msg["tool_calls"] = calls
    return msg, draw(st.lists(st.integers(1, 6), max_size=20))


@given(assistant_messages())
def test_random_outputs_round_trip_in_random_rows(fe, case):
    msg, sizes = case
    check_round_trip(fe, msg, sizes)


def test_length_cut_stays_reasoning(fe):
    ids = fe.tokenizer.encode("Still thinking about </thi")
    s = open_chat(fe, options=OutputOptions(max_tokens=len(ids)))
    chunks, _ = stream(s, ids)
    r = s.result()
    assert r.finish_reason is FinishReason.LENGTH and r.reasoning == "Still thinking about </thi" and r.content == ""


def test_tool_call_before_think_end_ends_reasoning(fe):
    body = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>"
    ids = fe.tokenizer.encode("I should search.\n" + body) + [IM_END]
    s = open_chat(fe)
    chunks, _ = stream(s, ids)
    r = s.result()
    assert r.reasoning == "I should search." and r.content == ""
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("search", '{"query": "q"}')]


def test_no_partial_tag_leaks_as_content(fe):
    text = "Answer</think>\n\nSee <tool_ca"
    ids = fe.tokenizer.encode(text)
    s = open_chat(fe)
    for t in ids:
        chunk = s.commit(s.preview([t]))
        assert "<" not in chunk.text
    chunk = s.commit(s.preview([IM_END]))
    assert chunk.text == " <tool_ca" and s.result().content == "See <tool_ca"


def test_malformed_calls_fall_back_to_content_and_are_reported(fe):
    bad = "<tool_call>\n<function=nope>\n</function>\n</tool_call>"
    unterminated = "<tool_call>\n<function=search>\n<parameter=query>\nq"
    for text, issue in ((bad, "undeclared tool 'nope'"), (unterminated, "unterminated")):
        s = open_chat(fe, thinking=False)
        stream(s, fe.tokenizer.encode(text) + [IM_END])
        r = s.result()
        assert r.content == text and not r.tool_calls and issue in r.issues[0]
        assert r.finish_reason is FinishReason.STOP


def test_no_tool_parsing_without_tools_or_with_choice_none(fe):
    body = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>"
    for tools, choice in ((None, None), (TOOLS, "none")):
        s = open_chat(fe, tools=tools, thinking=False, tool_choice=choice)
        stream(s, fe.tokenizer.encode(body) + [IM_END])
        assert s.result().content == body and s.result().finish_reason is FinishReason.STOP


def test_arguments_typed_by_schema(fe):
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\nmany\n"
            "</parameter>\n<parameter=metric>\nfalse\n</parameter>\n<parameter=opts>\n{\"u\": \"C\"}\n</parameter>\n"
            "<parameter=extra>\nx\n</parameter>\n</function>\n</tool_call>")
    s = open_chat(fe, thinking=False)
    stream(s, fe.tokenizer.encode(text) + [IM_END])
    args = json.loads(s.result().tool_calls[0].arguments)
    assert args == {"city": "42", "days": "many", "metric": False, "opts": {"u": "C"}, "extra": "x"}


def test_preview_is_a_fork_and_commit_adopts_it(fe):
    s = open_chat(fe, thinking=False)
    ids = fe.tokenizer.encode("Hello world")
    first = s.preview(ids)
    again = s.preview(ids)  # the dropped first preview changed nothing
    assert first.chunk == again.chunk and s.generated == 0
    s.commit(again)
    with pytest.raises(EngineFailure, match="stale OutputPreview"):
        s.commit(first)
    assert s.generated == len(ids)
    p = s.preview([IM_END, 5, 6])
    d = p.decision()
    assert (d.accepted, d.terminal, d.boundary) == (1, True, 1)
    s.commit(p)
    with pytest.raises(EngineFailure, match="after the output ended"):
        s.preview([1])
    assert s.result().content == "Hello world"


def test_a_dropped_preview_leaves_the_channels_as_they_were(fe):
    """A dropped preview that ends the reasoning (`</think>`) or opens a tool call moves only its fork's parser: the
    committed tokens after it still parse as reasoning (a parser shared with the fork would have moved on)."""
    s = open_chat(fe)
    tok = fe.tokenizer
    s.commit(s.preview(tok.encode("Think")))
    s.preview(tok.encode("</think>\n\n<tool_call>"))  # dropped: the Engine cut the row
    s.commit(s.preview(tok.encode(" more")))
    s.commit(s.preview([IM_END]))
    r = s.result()
    assert (r.reasoning, r.content, r.tool_calls) == ("Think more", "", ())


def test_result_before_the_end_is_an_error(fe):
    with pytest.raises(EngineFailure, match="before the output ended"):
        open_chat(fe).result()


def test_thinking_budget_forces_the_think_end_suffix(fe):
    s = open_chat(fe, options=OutputOptions(thinking_budget=3, max_tokens=50))
    ids = fe.tokenizer.encode("one two three four")
    s.commit(s.preview(ids[:2]))
    assert s.control_suffix() is None
    s.commit(s.preview(ids[2:4]))
    suffix = s.control_suffix()
    assert suffix is not None and fe.tokenizer.decode(suffix) == "\n</think>\n\n"
    forced = s.preview(suffix, forced=True)
    assert forced.accepted == len(suffix) and not forced.terminal
    s.commit(forced)
    assert s.control_suffix() is None
    stream(s, fe.tokenizer.encode("Done.") + [IM_END])
    r = s.result()
    assert r.reasoning == "one two three four" and r.content == "Done."


def test_forced_suffix_must_fit_in_max_tokens(fe):
    s = open_chat(fe, options=OutputOptions(thinking_budget=1, max_tokens=3))
    s.commit(s.preview(fe.tokenizer.encode("a b")))
    assert s.control_suffix() is None  # 2 + 3 suffix tokens would pass max_tokens=3


def test_max_tokens_resolves_to_the_context_left(fe):
    prepared = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}]))
    s = fe.open_session(prepared.prompt, OutputOptions())
    assert s.options.max_tokens == fe.max_context - len(prepared.prompt)
    assert fe.open_session(prepared.prompt, OutputOptions(max_tokens=7)).options.max_tokens == 7
    assert s.next_token_mask() is None  # nothing constrains a plain request


def test_openai_shapes_of_results_and_deltas(fe):
    msg = {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [call("search", query="q")]}
    s = open_chat(fe)
    chunks, _ = stream(s, fe.tokenizer.encode(generated_text(msg)))
    m = s.result().as_openai_message()
    assert m["content"] is None and m["reasoning_content"] == "r"
    assert m["tool_calls"] == [{"id": m["tool_calls"][0]["id"], "type": "function",
                                "function": {"name": "search", "arguments": '{"query": "q"}'}}]
    deltas = [d.as_openai() for c in chunks for d in c.tool_calls]
    assert deltas[0]["function"] == {"name": "search", "arguments": ""} and "id" not in deltas[1]
    # Reassembling the fragments, as the OpenAI client does, gives the final arguments.
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"query": "q"}'


def test_end_flushes_what_was_held_back_and_keeps_the_reason(fe):
    s = open_chat(fe, thinking=False, options=OutputOptions(max_tokens=50, stop=("xyz!",)))
    ids = fe.tokenizer.encode("hello xyz")  # "xyz" may still become the stop string: held back
    preview = s.preview(ids)
    assert not preview.terminal
    published = s.commit(preview).text
    tail = s.end(FinishReason.DEADLINE)
    assert tail is not None and published + tail.text == "hello xyz"
    r = s.result()
    assert r.content == "hello xyz" and r.finish_reason is FinishReason.DEADLINE and r.completion_tokens == len(ids)
    with pytest.raises(EngineFailure):
        s.end(FinishReason.CANCELLED)
