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
