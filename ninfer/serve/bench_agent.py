"""`ninfer bench agent`: a scripted multi-turn tool-calling conversation with thinking against any OpenAI-compatible
chat endpoint, per turn: prompt tokens, tokens new since the previous turn, cached and prefilled tokens, and TTFT.

Each conversation asks one question, then for `turns` turns streams one completion (`max_tokens` of output, the
model's own output is not kept) and appends a scripted assistant turn (reasoning plus one tool call) and the tool's
result of `tool_result_len` words, so the context grows by the same amount every turn. Because every assistant turn
follows the last user query, the history keeps its reasoning, and an exact prefix cache reuses the whole previous
prompt: after turn 1 a turn should prefill only its new tokens. `concurrency` conversations run at once, each with
its own words and its own `prompt_cache_key`.

`reuse_after_unrelated` runs one more conversation, then that many unrelated one-off chat requests through the same
server, then the conversation's next turn; `agent_targets` checks issue 10's targets: after turn 1 each turn
prefills at most its new tokens plus 64; TTFT stays within 1.5x of turn 2's (turns 2.. all add the same number of
new tokens, turn 1 fewer); the next turn after the unrelated requests reuses over 90% of the previous prompt.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass

import httpx

WORDS = ("river", "stone", "cloud", "ember", "field", "glass", "harbor", "lantern", "meadow", "orbit", "pepper",
         "quartz", "signal", "timber", "velvet", "willow")
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a topic up.",
                                         "parameters": {"type": "object", "properties": {"topic": {"type": "string"}},
                                                        "required": ["topic"]}}}


@dataclass(frozen=True)
class AgentConfig:
    base_url: str
    model: str | None = None
    turns: int = 10
    concurrency: int = 1
    tool_result_len: int = 1600  # words per tool result: ~16k tokens of context after 10 turns
    max_tokens: int = 16
    seed: int = 0
    api_key: str | None = None
    timeout: float = 600.0


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    prompt_tokens: int
    new_tokens: int  # prompt tokens added since the previous turn's prompt (all of them on turn 1)
    cached_tokens: int
    ttft_s: float
    error: str = ""

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens


async def _turn(client: httpx.AsyncClient, body: dict) -> tuple[float, dict | None, str]:
    """(TTFT, usage, error) of one streamed chat completion."""
    start = time.perf_counter()
    try:
        return await _read(client, body, start)
    except httpx.HTTPError as e:
        return 0.0, None, f"{type(e).__name__}: {e}"


async def _read(client: httpx.AsyncClient, body: dict, start: float) -> tuple[float, dict | None, str]:
    ttft, usage = 0.0, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            return 0.0, None, f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 0.0, None, str(chunk["error"].get("message"))
            if not ttft and any(c.get("delta", {}).get(k) for c in chunk.get("choices") or ()
                                for k in ("content", "reasoning_content", "tool_calls")):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    return ttft, usage, "" if usage else "no usage chunk in the stream"


class Script:
    """One conversation's scripted messages: a question, then per turn a scripted assistant turn (reasoning and one
    tool call) and the tool's result. They depend only on (seed, tag, index), never on the model's output."""

    def __init__(self, cfg: AgentConfig, tag: object, index: int):
        # words of its own per (seed, tag, conversation): a run never reuses an earlier run's context
        self.cfg, self.key = cfg, f"agent-{cfg.seed}-{tag}-{index}"
        self.rng = random.Random(f"{cfg.seed}-{tag}-{index}")
        self.messages: list[dict] = [{"role": "user", "content": f"Conversation {index}: research {self.words(12)}."}]

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def body(self) -> dict:
        cfg = self.cfg
        return {"model": cfg.model, "messages": self.messages, "tools": [TOOL], "max_tokens": cfg.max_tokens,
                "temperature": 0.0, "seed": cfg.seed, "stream": True, "stream_options": {"include_usage": True},
                "prompt_cache_key": self.key}

    def advance(self, t: int) -> None:
        topic = self.words(2)
        self.messages.append({"role": "assistant", "content": "", "reasoning_content": f"I should look up {topic}.",
                              "tool_calls": [{"id": f"call_{t}", "type": "function",
                                              "function": {"name": "lookup",
                                                           "arguments": json.dumps({"topic": topic})}}]})
        self.messages.append({"role": "tool", "tool_call_id": f"call_{t}",
                              "content": self.words(self.cfg.tool_result_len)})


def _cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


async def _conversation(client: httpx.AsyncClient, cfg: AgentConfig, index: int) -> list[Turn]:
    script = Script(cfg, cfg.concurrency, index)
    out, previous = [], 0
    for t in range(1, cfg.turns + 1):
        ttft, usage, error = await _turn(client, script.body())
        if usage is None:
            out.append(Turn(index, t, 0, 0, 0, 0.0, error))
            break
        prompt = usage["prompt_tokens"]
        out.append(Turn(index, t, prompt, prompt - previous, _cached(usage), ttft))
        previous = prompt
        script.advance(t)
    return out


def _client(cfg: AgentConfig, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    return httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=cfg.timeout, transport=transport,
                             limits=httpx.Limits(max_connections=None))


async def _with_model(client: httpx.AsyncClient, cfg: AgentConfig) -> AgentConfig:
    if cfg.model is not None:
        return cfg
    models = (await client.get("/v1/models")).json()["data"]
    return AgentConfig(**{**asdict(cfg), "model": models[0]["id"]})


async def run_agent_bench(cfg: AgentConfig, transport: httpx.AsyncBaseTransport | None = None) -> list[Turn]:
    async with _client(cfg, transport) as client:
        cfg = await _with_model(client, cfg)
        runs = await asyncio.gather(*(_conversation(client, cfg, i) for i in range(cfg.concurrency)))
    return [turn for run in runs for turn in run]


async def reuse_after_unrelated(cfg: AgentConfig, unrelated: int,
                                transport: httpx.AsyncBaseTransport | None = None) -> dict:
    """A conversation of cfg.turns turns, then `unrelated` one-off chat requests (4 at a time, no tools, no session
    key, words of their own), then the conversation's next turn: how much of the previous prompt it reuses."""
    async with _client(cfg, transport) as client:
        cfg = await _with_model(client, cfg)
        script, previous = Script(cfg, "reuse", 0), 0
        for t in range(1, cfg.turns + 1):
            _, usage, error = await _turn(client, script.body())
            if usage is None:
                return {"unrelated": unrelated, "error": error, "reuse": 0.0}
            previous = usage["prompt_tokens"]
            script.advance(t)
        rng, gate = random.Random(f"{cfg.seed}-unrelated"), asyncio.Semaphore(4)

        async def one(i: int) -> str:
            text = " ".join(rng.choice(WORDS) for _ in range(8 + i % 24))
            body = {"model": cfg.model, "messages": [{"role": "user", "content": f"Question {i}: {text}?"}],
                    "max_tokens": 1, "temperature": 0.0, "seed": cfg.seed, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with gate:
                return (await _turn(client, body))[2]

        errors = await asyncio.gather(*(one(i) for i in range(unrelated)))
        _, usage, error = await _turn(client, script.body())
    if usage is None:
        return {"unrelated": unrelated, "error": error, "reuse": 0.0}
    cached = _cached(usage)
    return {"unrelated": unrelated, "failed_unrelated": sum(1 for e in errors if e), "previous_prompt_tokens": previous,
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached, "reuse": cached / max(previous, 1)}


def summarize_turns(turns: list[Turn]) -> dict:
    """Per turn index, over the conversations: mean prompt, new, cached and prefilled tokens and TTFT; and the
    worst excess of prefilled over new tokens after turn 1 (the target: at most 64)."""
    ok = [t for t in turns if not t.error]
    by_turn: dict[int, list[Turn]] = {}
    for t in ok:
        by_turn.setdefault(t.turn, []).append(t)
    rows = []
    for n, ts in sorted(by_turn.items()):
        mean = lambda f: sum(f(t) for t in ts) / len(ts)  # noqa: E731
        rows.append({"turn": n, "prompt_tokens": mean(lambda t: t.prompt_tokens),
                     "new_tokens": mean(lambda t: t.new_tokens), "cached_tokens": mean(lambda t: t.cached_tokens),
                     "prefilled_tokens": mean(lambda t: t.prefilled), "ttft_ms": 1000 * mean(lambda t: t.ttft_s)})
    later = [t for t in ok if t.turn > 1]
    return {"turns": rows, "failed": len(turns) - len(ok), "errors": sorted({t.error for t in turns if t.error})[:5],
            "max_excess_prefill": max((t.prefilled - t.new_tokens for t in later), default=0)}


def format_turns(s: dict, concurrency: int) -> str:
    head = f"{'turn':>4} {'prompt':>8} {'new':>7} {'cached':>8} {'prefilled':>9} {'TTFT ms':>9}"
    lines = [f"============ Agent Benchmark ({concurrency} conversation(s)) ============", head]
    lines += [f"{r['turn']:>4} {r['prompt_tokens']:>8.0f} {r['new_tokens']:>7.0f} {r['cached_tokens']:>8.0f} "
              f"{r['prefilled_tokens']:>9.0f} {r['ttft_ms']:>9.1f}" for r in s["turns"]]
    lines.append(f"max prefilled - new after turn 1: {s['max_excess_prefill']} tokens")
    lines += [f"error: {e}" for e in s["errors"]]
    return "\n".join(lines)


def ttft_growth(s: dict) -> float | None:
    """The worst TTFT of turns 3.. over turn 2's: turns 2.. each add the same new tokens at a growing context
    (None with fewer than 3 turns)."""
    rows = {r["turn"]: r["ttft_ms"] for r in s["turns"]}
    if 2 not in rows or len(rows) < 3 or rows[2] <= 0:
        return None
    return max(v for t, v in rows.items() if t > 2) / rows[2]


def agent_targets(summaries: dict[int, dict], reuse: dict | None) -> list[dict]:
    """Issue 10's targets with pass/fail: per concurrency, prefilled <= new + 64 after turn 1 (and no turn failed)
    and TTFT within 1.5x of turn 2's; and the reuse after the unrelated requests above 90%."""
    out = []
    for level, s in summaries.items():
        excess = s["max_excess_prefill"]
        out.append({"target": f"prefilled <= new + 64 after turn 1, {level} conversation(s)", "value": excess,
                    "limit": 64, "pass": excess <= 64 and s["failed"] == 0 and len(s["turns"]) > 1})
        growth = ttft_growth(s)
        out.append({"target": f"TTFT <= 1.5x turn 2's, {level} conversation(s)", "value": growth, "limit": 1.5,
                    "pass": growth is not None and growth <= 1.5})
    if reuse is not None:
        out.append({"target": f"reuse > 90% of the previous prompt after {reuse['unrelated']} unrelated requests",
                    "value": reuse["reuse"], "limit": 0.9, "pass": reuse["reuse"] > 0.9 and "error" not in reuse})
    return out


def format_targets(targets: list[dict]) -> str:
    def shown(v: object) -> str:
        return "n/a" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["============ Agent Benchmark targets ============"]
    lines += [f"{'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {shown(t['value'])} (limit {t['limit']})"
              for t in targets]
    return "\n".join(lines)
