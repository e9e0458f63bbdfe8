"""Conversations covering every shape of the Qwen3.5 chat format, shared by the rendering tests."""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "hours": {"type": "array", "items": {"type": "integer"}}, "opts": {"type": "object"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Web search <b>&</b> \"quotes\".",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "number"}},
                   "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]


def call(name, **arguments):
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "plain": dict(messages=[{"role": "user", "content": "Hello there"}]),
    "system": dict(messages=[{"role": "system", "content": "  You are terse.\n"},
                             {"role": "user", "content": "Hi ü 毕老师"}]),
    "empty_system": dict(messages=[{"role": "system", "content": ""}, {"role": "user", "content": "x"}]),
    "multi_turn": dict(messages=[
        {"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
        {"role": "user", "content": [{"type": "text", "text": "Thr"}, {"type": "text", "text": "ee"}]}]),
    "tools": dict(messages=[{"role": "system", "content": "Be helpful."},
                            {"role": "user", "content": "Weather in Paris?"}], tools=TOOLS),
    "tools_no_system": dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS),
    "tool_call_with_text": dict(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the tool.",
         "tool_calls": [call("get_weather", city="Paris", days=3, metric=True, hours=[1, 2], opts={"a": None})]},
        {"role": "tool", "content": "{\"temp\": 21}"}], tools=TOOLS),
    "parallel_calls": dict(messages=[
        {"role": "user", "content": "Paris and Rome"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("get_weather", city="Paris"), call("search", query="Rome weather", top_k=2.5)]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"},
        {"role": "assistant", "content": "Paris is sunny, Rome rainy.", "reasoning_content": "Both done."},
        {"role": "user", "content": "Thanks"}], tools=TOOLS),
    "string_arguments": dict(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "search", "arguments": "{\"query\": \"x y\", \"top_k\": 3}"}}]},
        {"role": "tool", "content": "  result  "}], tools=TOOLS),
    "reasoning_history": dict(messages=[
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nOld answer"},
        {"role": "user", "content": "B"},
        {"role": "assistant", "content": "New answer", "reasoning_content": "\nnew thought\n"},
        {"role": "tool", "content": "r"}]),
    "thinking_off": dict(messages=[{"role": "user", "content": "No thinking"}],
                         chat_template_kwargs={"enable_thinking": False}),
    "no_generation_prompt": dict(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                                 add_generation_prompt=False),
    "tool_response_user": dict(messages=[
        {"role": "user", "content": "real query"},
        {"role": "assistant", "content": "x", "reasoning_content": "r1"},
        {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}]),
}
