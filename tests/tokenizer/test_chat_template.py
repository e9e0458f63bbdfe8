"""The vendored Qwen3.5 chat template, rendered the way HF apply_chat_template renders it, and against HF itself."""

from __future__ import annotations

import hashlib
import json

import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.convert.chat_template import TEMPLATE_SHA256

RECORDED_IDS_HEAD = [248045, 846, 198, 20206]
RECORDED_IDS_TAIL = [248045, 74455, 198, 248068, 198]


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(template: str, messages: list[dict], tools: list[dict] | None = None,
           add_generation_prompt: bool = False, **extra) -> str:
    """The environment and variables transformers' apply_chat_template uses."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            bos_token=None, eos_token="<|im_end|>", **extra)


USER = [{"role": "user", "content": "Reply in one short sentence: what makes a good inference engine?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TOOL_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities, two calls.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Rome", "days": [1, 2]}}}]},
    {"role": "tool", "content": "sunny, 21C"},
    {"role": "tool", "content": "rain, 15C"},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\ngreeting\n</think>\n\nHello!"},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue.", "reasoning_content": "any colour"},
    {"role": "user", "content": [{"type": "text", "text": "Another one?"}]},
]
CASES = {
    "plain": dict(messages=USER, add_generation_prompt=True),
    "no_thinking": dict(messages=USER, add_generation_prompt=True, enable_thinking=False),
    "tools": dict(messages=TOOL_TURNS, tools=[WEATHER_TOOL], add_generation_prompt=True),
    "multi_turn": dict(messages=MULTI_TURN, add_generation_prompt=True),
    "no_generation_prompt": dict(messages=MULTI_TURN[:2]),
}


def test_packaged_template_is_the_vendored_file(chat_template):
    assert hashlib.sha256(chat_template.encode("utf-8")).hexdigest() == TEMPLATE_SHA256
    assert len(chat_template.encode("utf-8")) == 7756


def test_generation_prompt_opens_a_think_block(chat_template):
    text = render(chat_template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_thinking_off_closes_an_empty_think_block(chat_template):
    text = render(chat_template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                  enable_thinking=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_rendered_prompt_tokenizes_to_recorded_ids(chat_template, qwen_tok):
    ids = qwen_tok.encode(render(chat_template, USER, add_generation_prompt=True))
    assert len(ids) == 23
    assert ids[:4] == RECORDED_IDS_HEAD and ids[-5:] == RECORDED_IDS_TAIL


def test_tool_calls_render_as_qwen_xml(chat_template):
    text = render(chat_template, **CASES["tools"])
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    assert "\n\nBe brief.<|im_end|>\n" in text
    assert ("<|im_start|>assistant\n<think>\nTwo cities, two calls.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>") in text
    assert "<parameter=days>\n[1, 2]\n</parameter>" in text
    assert ("<|im_start|>user\n<tool_response>\nsunny, 21C\n</tool_response>\n<tool_response>\nrain, 15C\n"
            "</tool_response><|im_end|>\n") in text


def test_history_drops_reasoning_before_the_last_query(chat_template):
    text = render(chat_template, **CASES["multi_turn"])
    assert "greeting" not in text and "any colour" not in text
    assert "<|im_start|>assistant\nHello!<|im_end|>\n" in text


def test_template_errors_reach_the_caller(chat_template):
    with pytest.raises(jinja2.TemplateError, match="No user query found"):
        render(chat_template, [{"role": "system", "content": "only a system turn"}])


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_json, chat_template):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json), chat_template=chat_template,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_apply_chat_template(case, chat_template, hf_tokenizer, qwen_tok):
    kwargs = dict(CASES[case])
    messages, tools = kwargs.pop("messages"), kwargs.pop("tools", None)
    ours = render(chat_template, messages, tools=tools, **kwargs)
    theirs = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    assert ours == theirs
    their_ids = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **kwargs)
    assert qwen_tok.encode(ours) == list(their_ids)
