"""--request-timeout bounds queue plus run: a running request ends with its output so far and finish_reason
`length` (whole or streamed); one still waiting for a lane when its time is up gets 503 `queue_timeout`."""

from __future__ import annotations

import json

from ninfer.sampling import SamplingParams
from ninfer.serve.limits import ServeLimits
from ninfer.serve.submit import submit

LONG = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 400, "ignore_eos": True}


def test_a_running_request_ends_with_length_and_its_output(make_client):
    c = make_client(limits=ServeLimits(request_timeout=0.5))
    body = c.post("/v1/chat/completions", json=LONG).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] < 400 and body["choices"][0]["message"]["content"] is not None


def test_a_stream_ends_with_length_then_done(make_client):
    c = make_client(limits=ServeLimits(request_timeout=0.5))
    with c.stream("POST", "/v1/completions", json={"prompt": "count", "max_tokens": 400, "ignore_eos": True,
                                                   "stream": True, "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    finals = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] < 400


def test_a_request_still_waiting_gets_503_queue_timeout(make_client, gen_runtime):
    rt = gen_runtime
    hogs = []
    for _ in range(rt.options.max_num_seqs):  # every lane busy for far longer than the timeout
        prompt = rt.frontend.prepare_text("hog", max_tokens=400)
        hogs.append(submit(rt, prompt, SamplingParams.create(max_tokens=400, ignore_eos=True)))
    try:
        c = make_client(limits=ServeLimits(request_timeout=0.5))
        resp = c.post("/v1/chat/completions", json={**LONG, "max_tokens": 2})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "queue_timeout", resp.text
    finally:
        for h in hogs:
            h.close()
