"""The HTTP robustness figures for docs/performance.md (a benchmark, not a test; the tests assert the same things).

    PYTHONPATH=. python benchmarks/http_robustness.py [--burst 200] [--storm 60] [--bodies 8] [--only bodies]

Serves the embedded random-weight model on 127.0.0.1 (reference Program, context 256, 2 lanes, no prefix
cache; queue 64 so that the storm is admitted), then: sends tests/e2e/test_hostile.py's table, counting answers by status and 5xx;
a burst of concurrent chat requests (200 or 429 expected); a disconnect storm (tests/e2e/test_disconnect_storm.py's
four kinds of drop); and times how long the costliest refusals take while /health keeps answering (the worst
/health latency seen during them); then `--bodies` clients at once each send multi-megabyte JSON bodies (210k tiny
messages, a 7 MiB prompt, a 7 MiB chat message; all refused after parsing) for `--rounds` rounds while /health is
timed (its worst and its 99th percentile latency; senders and prober run in processes of their own, so that only
the server's own work holds its GIL). After each phase the server must be ready at baseline capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import threading
import time

import httpx


def _health_watch(url: str, stop: threading.Event, worst: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            t = time.monotonic()
            client.get("/health")
            worst[0] = max(worst[0], time.monotonic() - t)
            time.sleep(0.02)


def _probe_health(url: str, stop, results) -> None:
    """In its own process (a prober in the server's process would share its GIL): /health latencies until stop."""
    seen = []
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            t = time.monotonic()
            client.get("/health")
            seen.append(time.monotonic() - t)
            if len(seen) == 1:
                results.put("probing")
            time.sleep(0.01)
    results.put(seen)


def _send_bodies(url: str, clients: int, rounds: int, results) -> None:
    """In its own process: `clients` connections at once, each sending `rounds` multi-MB bodies in turn."""
    from tests.e2e import test_hostile as hostile

    bodies = [(path, hostile._encode(body)) for name, path, body, _ in hostile.ROWS
              if name in ("messages_210k", "prompt_7MiB", "chat_content_7MiB")]
    statuses: collections.Counter = collections.Counter()

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300,
                                     headers={"content-type": "application/json"}) as client:
            async def one(i: int) -> None:
                for r in range(rounds):
                    path, body = bodies[(i + r) % len(bodies)]
                    statuses[(await client.post(path, content=body)).status_code] += 1
            await asyncio.gather(*(one(i) for i in range(clients)))

    asyncio.run(run())
    results.put(dict(sorted(statuses.items())))


def _bodies_phase(url: str, clients: int, rounds: int) -> dict:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop, probes, sent = ctx.Event(), ctx.Queue(), ctx.Queue()
    prober = ctx.Process(target=_probe_health, args=(url, stop, probes))
    prober.start()
    assert probes.get(timeout=120) == "probing"
    t = time.monotonic()
    sender = ctx.Process(target=_send_bodies, args=(url, clients, rounds, sent))
    sender.start()
    statuses = sent.get(timeout=600)
    took = time.monotonic() - t
    sender.join()
    stop.set()
    seen = sorted(probes.get(timeout=120))
    prober.join()
    return {"clients": clients, "bodies": clients * rounds, "by_status": statuses, "seconds": round(took, 1),
            "health_probes": len(seen), "worst_health_s": round(seen[-1], 3),
            "p99_health_s": round(seen[int(0.99 * (len(seen) - 1))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--storm", type=int, default=60)
    parser.add_argument("--bodies", type=int, default=8, help="clients sending multi-MB bodies at once")
    parser.add_argument("--rounds", type=int, default=3, help="bodies each of those clients sends in turn")
    parser.add_argument("--only", choices=("hostile", "burst", "storm", "bodies"), action="append",
                        help="run only these phases (repeatable); default all")
    args = parser.parse_args()
    phases = set(args.only or ("hostile", "burst", "storm", "bodies"))

    from ninfer.serve.app import create_app
    from ninfer.serve.state import ServerState
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.wiring import build_runtime
    from tests.e2e import test_disconnect_storm as storm
    from tests.e2e import test_hostile as hostile
    from tests.e2e.conftest import ThreadServer
    from tests.e2e.robustness import assert_baseline

    rt = build_runtime(RuntimeOptions(max_model_len=256, max_num_seqs=2, max_queued_requests=64,
                                      enable_prefix_caching=False), progress=False)
    state = ServerState(rt, rt.name)
    out: dict = {}
    with ThreadServer(create_app(state)) as server:
        if "hostile" in phases:
            out["hostile"] = _hostile_phase(server.url)
            assert_baseline(server.url, state)
        if "burst" in phases:
            t = time.monotonic()
            burst = asyncio.run(hostile._burst(server.url, args.burst))
            out["burst"] = {"clients": args.burst, "by_status": dict(collections.Counter(s for s, _ in burst)),
                            "seconds": round(time.monotonic() - t, 1)}
            assert_baseline(server.url, state)
        if "storm" in phases:
            t = time.monotonic()
            outcomes = asyncio.run(storm._storm(server.url, args.storm))
            assert_baseline(server.url, state)
            out["storm"] = {"clients": args.storm, "outcomes": dict(collections.Counter(outcomes)),
                            "settled_s": round(time.monotonic() - t, 1)}
        if "bodies" in phases:
            out["bodies"] = _bodies_phase(server.url, args.bodies, args.rounds)
            assert_baseline(server.url, state)
    rt.close()
    print(json.dumps(out, indent=1))


def _hostile_phase(url: str) -> dict:
    from tests.e2e import test_hostile as hostile

    stop, worst = threading.Event(), [0.0]
    watcher = threading.Thread(target=_health_watch, args=(url, stop, worst), daemon=True)
    watcher.start()
    statuses, took = collections.Counter(), {}
    with httpx.Client(base_url=url, timeout=120, headers={"content-type": "application/json"}) as client:
        for name, path, body, _ in hostile.ROWS:
            t = time.monotonic()
            statuses[client.post(path, content=hostile._encode(body)).status_code] += 1
            took[name] = time.monotonic() - t
    stop.set()
    watcher.join()
    slowest = sorted(took.items(), key=lambda kv: -kv[1])[:4]
    return {"inputs": len(hostile.ROWS), "by_status": dict(sorted(statuses.items())),
            "5xx": sum(n for s, n in statuses.items() if s >= 500),
            "slowest_s": {k: round(v, 2) for k, v in slowest}, "worst_health_s": round(worst[0], 3)}


if __name__ == "__main__":
    main()
