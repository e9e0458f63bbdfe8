"""Frontend host costs on the real Qwen3.5 vocabulary (a script, not a test).

Run: python benchmarks/frontend_bench.py [--repeat 3] [--clock cpu|wall]
Prints p50 / p99 / max in microseconds of
  - grammar mask fill per request per step (single row, and 4 or 15 draft columns: an MTP block, a DFlash block
    of 16), along a real constrained output;
  - the output pipeline per token (preview + commit: detokenize, stops, channels) and raw detokenization;
  - prompt preparation per request (render + tokenize + digests), and rendering alone.
The default clock is this thread's CPU time, so preemption on a busy machine does not show up as a tail;
`--clock wall` measures what a caller waits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ninfer.convert.chat_template import default_chat_template
from ninfer.convert.tokenizer import build_qwen35_tokenizer_json
from ninfer.frontend import ChatRequest, Frontend, OutputOptions
from ninfer.frontend.detokenizer import Detokenizer
from ninfer.frontend.jinja_template import JinjaChatTemplate
from ninfer.frontend.messages import normalize_chat
from ninfer.frontend.render import render_qwen35
from ninfer.frontend.tokenizer import Qwen35Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "units": {"enum": ["C", "F"]}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]}}, "required": ["name", "age"]}
ANSWER = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"], "address": {"city": "London", "zip": "W1"}}'
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris and Rome this week? " * 4},
    {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two calls.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "content": "sunny, 21 C"}, {"role": "tool", "content": "rain, 17 C"},
    {"role": "assistant", "content": "Paris is sunny; Rome is rainy."},
    {"role": "user", "content": "And tomorrow?"}]


def stats(samples: list[float]) -> str:
    s = sorted(samples)
    p = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1e6
    return f"p50 {p(0.5):9.1f}  p99 {p(0.99):9.1f}  max {s[-1] * 1e6:9.1f}  (n={len(s)})"


CLOCK = time.thread_time


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = CLOCK()
        fn()
        out.append(CLOCK() - t)
    return out


def mask_fill(fe: Frontend, repeat: int) -> None:
    tok = fe.tokenizer
    cases = {
        "json_schema": (dict(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}), ANSWER),
        "tools+reasoning": (dict(tools=TOOLS, tool_choice="required"),
                            "Need the weather for Paris first.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                            "</tool_call>"),
    }
    for name, (fields, text) in cases.items():
        thinking = name != "json_schema"
        kwargs = None if thinking else {"enable_thinking": False}
        single, drafts = [], {4: [], 15: []}  # MTP k = 4, DFlash block 16
        for _ in range(repeat):
            prepared = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], chat_template_kwargs=kwargs,
                                                   **fields))
            s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
            ids = tok.encode(text)
            out = s.grammar.allocate(16)
            for i, t in enumerate(ids):
                single.extend(timed(s.next_token_mask, 1))
                for k, samples in drafts.items():  # the true continuation: every prefix row is reachable
                    samples.extend(timed(lambda: s.grammar.fill_bitmask(ids[i + 1:i + 1 + k], out), 1))
                s.commit(s.preview([t]))
        print(f"mask fill, 1 row      [{name:16s}] {stats(single)}")
        for k, samples in drafts.items():
            print(f"mask fill, {k:2d} drafts  [{name:16s}] {stats(samples)}")


def output_pipeline(fe: Frontend, repeat: int) -> None:
    tok = fe.tokenizer
    text = ("Thinking about the question in some detail, with ü and 毕 and emoji 😀.\n</think>\n\n"
            "The answer is forty-two. " * 20)
    ids = tok.encode(text)
    per_token, raw, whole = [], [], []
    prepared = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], tools=TOOLS))
    options = OutputOptions(stop=("STOP", "\n\nUser:"))
    for _ in range(repeat):
        s = fe.open_session(prepared.prompt, options, prepared.structured)
        for t in ids:
            per_token.extend(timed(lambda: s.commit(s.preview([t])), 1))
        d = Detokenizer(fe.table)
        for t in ids:
            raw.extend(timed(lambda: d.push(t), 1))
        # the same stream untimed per call: one clock read per session (a read per call costs ~1 us itself)
        t0 = CLOCK()
        for _ in range(10):
            s = fe.open_session(prepared.prompt, options, prepared.structured)
            for t in ids:
                s.commit(s.preview([t]))
        whole.append((CLOCK() - t0) / (10 * len(ids)))
    print(f"output per token (preview+commit)         {stats(per_token)}")
    print(f"output per token, whole sessions: median {statistics.median(whole) * 1e6:.1f} us (n={len(whole)})")
    print(f"detokenize per token                      {stats(raw)}")


def prompts(fe: Frontend, repeat: int) -> None:
    request = ChatRequest(CONVERSATION, TOOLS)
    chat = normalize_chat(CONVERSATION, TOOLS)
    jinja = JinjaChatTemplate(default_chat_template())
    n = 20 * repeat
    print(f"prepare_chat (jinja + tokenize + digest)  {stats(timed(lambda: fe.prepare_chat(request), n))}")
    print(f"render, built-in                          "
          f"{stats(timed(lambda: render_qwen35(chat.messages, chat.tools), n))}")
    print(f"render, jinja                             "
          f"{stats(timed(lambda: jinja.render(chat.messages, chat.tools), n))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    tok = Qwen35Tokenizer.load(build_qwen35_tokenizer_json())
    fe = Frontend(tok, max_context=32768, chat_template=default_chat_template())
    fe.grammar  # build the compiler (TokenizerInfo of 248,320 ids) outside the timings
    mask_fill(fe, args.repeat)
    output_pipeline(fe, args.repeat)
    prompts(fe, args.repeat)
    print(f"clock: {args.clock}; load average during the run: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
