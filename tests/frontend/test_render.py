"""The built-in renderer, the Jinja template and transformers' apply_chat_template agree byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from corpus import CONVERSATIONS, TOOLS, call
from ninfer.contracts import RejectReason, RequestRejected
from ninfer.frontend import ChatRequest
from ninfer.frontend.jinja_template import JinjaChatTemplate
from ninfer.frontend.messages import normalize_chat
from ninfer.frontend.render import render_qwen35


@pytest.fixture(scope="module")
def hf(tok, template):
    t = PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    t.chat_template = template
    return t


@pytest.fixture(scope="module")
def jinja(template):
    return JinjaChatTemplate(template)


def _three_ways(conv, jinja, hf):
    chat = normalize_chat(conv["messages"], conv.get("tools"))
    kwargs = conv.get("chat_template_kwargs", {})
    agp = conv.get("add_generation_prompt", True)
    builtin = render_qwen35(chat.messages, chat.tools, add_generation_prompt=agp,
                           enable_thinking=kwargs.get("enable_thinking", True)).text
    via_jinja = jinja.render(chat.messages, chat.tools, add_generation_prompt=agp, template_kwargs=kwargs)
    via_hf = hf.apply_chat_template(list(chat.messages), tools=list(chat.tools) or None, tokenize=False,
                                    add_generation_prompt=agp, **kwargs)
    return builtin, via_jinja, via_hf


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_corpus_renders_identically(name, jinja, hf):
    builtin, via_jinja, via_hf = _three_ways(CONVERSATIONS[name], jinja, hf)
    assert builtin == via_jinja == via_hf


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_prompt_tokens_match_transformers(name, fe, fe_builtin, hf):
    conv = CONVERSATIONS[name]
    request = ChatRequest(conv["messages"], conv.get("tools"), chat_template_kwargs=conv.get("chat_template_kwargs"),
                          add_generation_prompt=conv.get("add_generation_prompt", True))
    chat = normalize_chat(conv["messages"], conv.get("tools"))
    text = hf.apply_chat_template(list(chat.messages), tools=list(chat.tools) or None, tokenize=False,
                                  add_generation_prompt=request.add_generation_prompt,
                                  **(request.chat_template_kwargs or {}))
    expected = tuple(hf(text, add_special_tokens=False)["input_ids"])
    assert fe.prepare_chat(request).prompt.token_ids == expected
    assert fe_builtin.prepare_chat(request).prompt.token_ids == expected


def test_generation_prompt_thinking_on_and_off(fe):
    on = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}])).prompt
    off = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}],
                                      chat_template_kwargs={"enable_thinking": False})).prompt
    assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.reasoning_open
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not off.reasoning_open


_text = st.lists(st.sampled_from(list("ab \n<>/=é毕😀") + ["<think>", "</think>", "<tool_call>", "\n\n"]),
                 max_size=8).map("".join)
_args = st.dictionaries(st.sampled_from(["city", "days", "metric", "hours", "opts"]),
                        st.one_of(st.text(max_size=5), st.integers(-5, 5), st.booleans(), st.none(),
                                  st.lists(st.integers(0, 3), max_size=3), st.floats(0, 10, allow_nan=False)),
                        max_size=3)


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(_text)})
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(_text)})
        if draw(st.booleans()):
            m = {"role": "assistant", "content": draw(st.one_of(st.none(), _text))}
            if draw(st.booleans()):
                m["reasoning_content"] = draw(_text)
            calls = draw(st.lists(st.builds(lambda a: call("get_weather", **a), _args), max_size=2))
            if calls:
                m["tool_calls"] = calls
            msgs.append(m)
            for _ in range(len(calls)):
                msgs.append({"role": "tool", "content": draw(_text)})
    kwargs = draw(st.sampled_from([{}, {"enable_thinking": False}, {"enable_thinking": True}]))
    return dict(messages=msgs, tools=TOOLS if draw(st.booleans()) else None, chat_template_kwargs=kwargs,
                add_generation_prompt=draw(st.booleans()))


@given(conversations())
def test_random_conversations_render_identically(jinja, hf, conv):
    builtin, via_jinja, via_hf = _three_ways(conv, jinja, hf)
    assert builtin == via_jinja == via_hf


@pytest.mark.parametrize("messages, needle", [
    ([], "non-empty list"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "s"}], "must be the first message"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text only"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "tool", "content": "r"}, {"role": "user", "content": "x"}], "must follow the assistant turn"),
    ([{"role": "system", "content": "s"}], "no user query"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}], "not valid JSON"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "bad name!", "arguments": "{}"}}]}], "function.name"),
])
def test_unrepresentable_conversations_are_rejected(fe, messages, needle):
    with pytest.raises(RequestRejected) as e:
        fe.prepare_chat(ChatRequest(messages))
    assert e.value.reason is RejectReason.UNREPRESENTABLE and needle in e.value.message


def test_bad_tools_and_template_kwargs_are_rejected(fe):
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(RequestRejected, match="declared twice"):
        fe.prepare_chat(ChatRequest(user, tools=[TOOLS[0], TOOLS[0]]))
    with pytest.raises(RequestRejected, match="tools\\[0\\]"):
        fe.prepare_chat(ChatRequest(user, tools=[{"type": "retrieval"}]))
    with pytest.raises(RequestRejected, match="may not set messages"):
        fe.prepare_chat(ChatRequest(user, chat_template_kwargs={"messages": []}))


def test_template_raise_exception_becomes_a_rejection(tok):
    from ninfer.frontend import Frontend
    strict = Frontend(tok, max_context=1000, chat_template="{{ raise_exception('nope: ' + messages[0].role) }}")
    with pytest.raises(RequestRejected, match="refused the conversation: nope: user"):
        strict.prepare_chat(ChatRequest([{"role": "user", "content": "x"}]))
