"""`ninfer bench serve`: latency percentiles of any OpenAI-compatible endpoint, measured like `vllm bench serve`.

Per request: TTFT (first streamed chunk with output), ITL (gaps between output chunks; a chunk carrying several
tokens counts once, as vLLM does), TPOT ((E2EL - TTFT) / (output tokens - 1)) and E2EL. Output tokens come from
the stream's usage chunk (stream_options.include_usage), else one per output chunk. Prompts are random token ids
of exactly --random-input-len tokens for /v1/completions, random words for /v1/chat/completions; `ignore_eos` and
`max_tokens` pin the output length.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from itertools import zip_longest
from dataclasses import dataclass, field

import httpx

from ninfer.errors import NinferError

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    ok: bool = False
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    draft_tokens: int = 0  # the usage extension of a speculative backend (0 without one)
    accepted_draft_tokens: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)  # rounds by emitted tokens (index i: i + 1)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(frozen=True)
class BenchConfig:
    base_url: str
    endpoint: str = "/v1/completions"
    model: str | None = None
    num_prompts: int = 20
    max_concurrency: int | None = None
    request_rate: float = float("inf")
    input_len: int = 32
    output_len: int = 16
    seed: int = 0
    api_key: str | None = None
    temperature: float = 0.0
    timeout: float = 600.0


def _payload(cfg: BenchConfig, rng: random.Random) -> dict:
    body = {"model": cfg.model, "max_tokens": cfg.output_len, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": cfg.temperature}
    if cfg.endpoint.endswith("chat/completions"):
        words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega")) for _ in range(cfg.input_len))
        return {**body, "messages": [{"role": "user", "content": words}]}
    return {**body, "prompt": [rng.randrange(1000, 100_000) for _ in range(cfg.input_len)]}


def _output_of(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


async def _one(client: httpx.AsyncClient, cfg: BenchConfig, body: dict) -> RequestRecord:
    rec, chunks = RequestRecord(), 0
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", cfg.endpoint, json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"].get("message"))
                    return rec
                now = time.perf_counter()
                if _output_of(chunk):
                    if chunks == 0:
                        rec.ttft = now - start
                    else:
                        rec.itl.append(now - last)
                    chunks, last = chunks + 1, now
                if chunk.get("usage"):
                    rec.output_tokens = chunk["usage"]["completion_tokens"]
                    rec.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    spec = chunk["usage"].get("speculative_decoding") or {}
                    rec.draft_tokens = spec.get("draft_tokens", 0)
                    rec.accepted_draft_tokens = spec.get("accepted_draft_tokens", 0)
                    rec.acceptance_lengths = list(spec.get("acceptance_lengths", ()))
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    rec.e2el = time.perf_counter() - start
    rec.output_tokens = rec.output_tokens or chunks
    rec.ok = True
    return rec


class BenchError(NinferError):
    """The endpoint cannot be benchmarked: nothing listens, it refuses the key, or it serves no model."""


async def served_model(client: httpx.AsyncClient, cfg: BenchConfig) -> str:
    """The first model id of GET /v1/models; a BenchError (one line) when the server cannot be asked."""
    where = f"{cfg.base_url}/v1/models"
    try:
        resp = await client.get("/v1/models")
    except httpx.ConnectError as e:
        raise BenchError(f"nothing answers at {cfg.base_url}: {e}").locate(
            where, hint="start `ninfer serve`, or pass --base-url / --host / --port of a running server") from None
    except httpx.HTTPError as e:
        raise BenchError(f"GET /v1/models failed: {type(e).__name__}: {e}").locate(where) from None
    if resp.status_code in (401, 403):
        hint = "pass the server's key with --api-key (or NINFER_API_KEY)" if not cfg.api_key else "check --api-key"
        raise BenchError(f"the server refused the request ({resp.status_code}): {_error_text(resp)}").locate(
            where, hint=hint)
    try:
        models = resp.json()["data"] if resp.status_code == 200 else None
        return str(models[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"GET /v1/models answered {resp.status_code} without a model: {_error_text(resp)}").locate(
            where, hint="name the model with --model") from None


def _error_text(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


async def run_bench(cfg: BenchConfig) -> tuple[list[RequestRecord], float]:
    rng = random.Random(cfg.seed)
    bodies = [_payload(cfg, rng) for _ in range(cfg.num_prompts)]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limit = asyncio.Semaphore(cfg.max_concurrency or cfg.num_prompts)
    async with httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=cfg.timeout,
                                 limits=httpx.Limits(max_connections=None)) as client:
        model = cfg.model or await served_model(client, cfg)
        cfg = BenchConfig(**{**cfg.__dict__, "model": model})
        bodies = [{**b, "model": model} for b in bodies]

        async def limited(body: dict) -> RequestRecord:
            async with limit:
                return await _one(client, cfg, body)

        start = time.perf_counter()
        tasks = []
        for body in bodies:
            tasks.append(asyncio.create_task(limited(body)))
            if cfg.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))  # Poisson arrivals, as vLLM's default
        records = list(await asyncio.gather(*tasks))
    return records, time.perf_counter() - start


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(records: list[RequestRecord], duration: float, percentiles: tuple[float, ...] = (50, 90, 99)) -> dict:
    ok = [r for r in records if r.ok]
    out = {"completed": len(ok), "failed": len(records) - len(ok), "duration_s": duration,
           "total_input_tokens": sum(r.prompt_tokens for r in ok),
           "total_output_tokens": sum(r.output_tokens for r in ok),
           "request_throughput": len(ok) / duration if duration else 0.0,
           "output_throughput": sum(r.output_tokens for r in ok) / duration if duration else 0.0,
           "errors": sorted({r.error for r in records if not r.ok})[:5]}
    drafted = sum(r.draft_tokens for r in ok)
    if drafted:
        accepted = sum(r.accepted_draft_tokens for r in ok)
        out.update(draft_tokens=drafted, accepted_draft_tokens=accepted, draft_acceptance_rate=accepted / drafted)
        out.update(_acceptance([sum(n) for n in zip_longest(*(r.acceptance_lengths for r in ok), fillvalue=0)]))
    samples = {"ttft": [r.ttft for r in ok], "e2el": [r.e2el for r in ok],
               "tpot": [r.tpot for r in ok if r.tpot is not None], "itl": [g for r in ok for g in r.itl]}
    for name in METRICS:
        values = [v * 1000 for v in samples[name]]
        if not values:
            continue
        out[f"mean_{name}_ms"] = sum(values) / len(values)
        out[f"median_{name}_ms"] = _percentile(values, 50)
        for p in percentiles:
            out[f"p{p:g}_{name}_ms"] = _percentile(values, p)
    return out


def _acceptance(rounds: list[int]) -> dict:
    """From rounds by emitted tokens: the histogram, the mean emitted tokens per round (vLLM's acceptance length)
    and, per draft position i, the share of rounds that accepted it (emitted more than i + 1 tokens)."""
    total = sum(rounds)
    if not total:
        return {}
    return {"acceptance_histogram": rounds,
            "mean_acceptance_length": sum((i + 1) * n for i, n in enumerate(rounds)) / total,
            "acceptance_per_position": [sum(rounds[i + 1:]) / total for i in range(len(rounds) - 1)]}


def format_summary(s: dict) -> str:
    lines = ["============ Serving Benchmark Result ============",
             f"{'Successful requests:':<40}{s['completed']}", f"{'Failed requests:':<40}{s['failed']}",
             f"{'Benchmark duration (s):':<40}{s['duration_s']:.2f}",
             f"{'Total input tokens:':<40}{s['total_input_tokens']}",
             f"{'Total generated tokens:':<40}{s['total_output_tokens']}",
             f"{'Request throughput (req/s):':<40}{s['request_throughput']:.2f}",
             f"{'Output token throughput (tok/s):':<40}{s['output_throughput']:.2f}"]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        keys = [k for k in s if k.endswith(f"_{name}_ms")]
        if keys:
            lines.append(f"{'-' * 15}{title}{'-' * 15}")
            lines += [f"{k.replace(f'_{name}_ms', '').capitalize() + f' {name.upper()} (ms):':<40}{s[k]:.2f}"
                      for k in keys]
    if "draft_tokens" in s:
        lines += [f"{'-' * 15}Speculative Decoding{'-' * 15}", f"{'Draft tokens:':<40}{s['draft_tokens']}",
                  f"{'Accepted draft tokens:':<40}{s['accepted_draft_tokens']}",
                  f"{'Draft acceptance rate (%):':<40}{100 * s['draft_acceptance_rate']:.2f}"]
    if "acceptance_histogram" in s:
        lines.append(f"{'Mean acceptance length:':<40}{s['mean_acceptance_length']:.2f}")
        lines.append(f"{'Per-position acceptance (%):':<40}"
                     + ", ".join(f"{100 * a:.1f}" for a in s["acceptance_per_position"]))
        lines += [f"{f'Rounds emitting {i + 1} token(s):':<40}{n}" for i, n in enumerate(s["acceptance_histogram"])]
    for e in s["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines + ["=" * 50])
