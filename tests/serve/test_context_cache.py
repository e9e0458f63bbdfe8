"""The context cache through the HTTP API: a chat's next turn reuses everything but the reasoning the rendering
drops, cached_tokens says exactly how much, and /metrics shows the cache's counters and bytes per tier. Requests
carry a seed, so they draw nothing from the shared server's --seed stream the other serve tests replay."""

from __future__ import annotations

CHAT = "/v1/chat/completions"


def metric(text: str, name: str) -> int:
    return int(next(line for line in text.splitlines() if line.startswith(name + " ")).split()[-1])


def test_next_chat_turn_reuses_all_but_the_dropped_reasoning(client):
    messages = [{"role": "user", "content": "Tell me about the sea, in detail. " * 4}]
    before = client.get("/metrics").text
    first = client.post(CHAT, json={"messages": messages, "max_tokens": 3, "prompt_cache_key": "conv-sea",
                                    "seed": 1}).json()
    reply = first["choices"][0]["message"]
    messages += [{"role": "assistant", "content": reply["content"] or "",
                  "reasoning_content": reply.get("reasoning_content")},
                 {"role": "user", "content": "And the rivers?"}]
    second = client.post(CHAT, json={"messages": messages, "max_tokens": 3, "user": "conv-sea", "seed": 1}).json()
    # the first prompt ended "<|im_start|>assistant\n<think>\n": the second renders that turn without "<think>\n"
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"] - 2
    after = client.get("/metrics").text
    assert metric(after, "ninfer:prefix_cache_hits_total") > metric(before, "ninfer:prefix_cache_hits_total")
    assert metric(after, "ninfer:prefix_cache_captures_total") > metric(before, "ninfer:prefix_cache_captures_total")
    assert metric(after, 'ninfer:prefix_cache_bytes{tier="device"}') > 0
    assert 'ninfer:prefix_cache_misses_total{cause="cold"}' in after


def test_cache_keys_are_checked(client):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "seed": 1}
    assert client.post(CHAT, json={**body, "prompt_cache_key": "k" * 257}).status_code == 400
    assert client.post(CHAT, json={**body, "prompt_cache_key": 7}).status_code == 400


def test_a_user_turn_after_a_tool_loop_resumes_before_the_first_dropped_reasoning(client):
    """After a tool-call loop, a new user message makes the template drop the reasoning of every assistant turn of
    the loop: none of those renderings ever ran, so the deepest exact boundary is the point before the loop's first
    "<think>" (turn 1's prompt less its 2 tokens "<think>\\n"), and exactly the rest is prefilled; inside the loop
    each turn reuses the whole previous prompt."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]}}}
    messages = [{"role": "user", "content": "Find facts about rivers."}]

    def send() -> dict:
        body = {"messages": messages, "tools": [tool], "max_tokens": 2, "prompt_cache_key": "conv-loop", "seed": 1}
        return client.post(CHAT, json=body).json()["usage"]

    first = send()
    previous = first
    for t in range(2):
        messages += [{"role": "assistant", "content": "", "reasoning_content": f"look up {t}",
                      "tool_calls": [{"id": f"c{t}", "type": "function",
                                      "function": {"name": "lookup", "arguments": f'{{"topic": "t{t}"}}'}}]},
                     {"role": "tool", "tool_call_id": f"c{t}", "content": "river stone " * 8}]
        usage = send()
        assert usage["prompt_tokens_details"]["cached_tokens"] == previous["prompt_tokens"]
        previous = usage
    messages += [{"role": "assistant", "content": "Rivers carve stones.", "reasoning_content": "summarize"},
                 {"role": "user", "content": "And clouds?"}]
    assert send()["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 2
