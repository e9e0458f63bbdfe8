"""The HTTP robustness figures for docs/performance.md (a benchmark, not a test; the tests assert the same things).

    PYTHONPATH=. python benchmarks/http_robustness.py [--burst 200] [--storm 60]

Serves the embedded random-weight model on 127.0.0.1 (reference Program, context 256, 2 lanes, no prefix
cache; queue 64 so that the storm is admitted), then: sends tests/e2e/test_hostile.py's table, counting answers by status and 5xx;
a burst of concurrent chat requests (200 or 429 expected); a disconnect storm (tests/e2e/test_disconnect_storm.py's
four kinds of drop); and times how long the costliest refusals take while /health keeps answering (the worst
/health latency seen during them). After each phase the server must be ready at baseline capacity.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--storm", type=int, default=60)
    args = parser.parse_args()

    from ninfer.serve.app import create_app
    from ninfer.serve.state import ServerState
    from ninfer.wiring import RuntimeOptions, build_runtime
    from tests.e2e import test_disconnect_storm as storm
    from tests.e2e import test_hostile as hostile
    from tests.e2e.conftest import ThreadServer
    from tests.e2e.robustness import assert_baseline

    rt = build_runtime(RuntimeOptions(max_model_len=256, max_num_seqs=2, max_queued_requests=64,
                                      enable_prefix_caching=False), progress=False)
    state = ServerState(rt, rt.name)
    out: dict = {}
    with ThreadServer(create_app(state)) as server:
        stop, worst = threading.Event(), [0.0]
        watcher = threading.Thread(target=_health_watch, args=(server.url, stop, worst), daemon=True)
        watcher.start()
        statuses, took = collections.Counter(), {}
        with httpx.Client(base_url=server.url, timeout=120, headers={"content-type": "application/json"}) as client:
            for name, path, body, _ in hostile.ROWS:
                t = time.monotonic()
                statuses[client.post(path, content=hostile._encode(body)).status_code] += 1
                took[name] = time.monotonic() - t
        stop.set()
        watcher.join()
        assert_baseline(server.url, state)
        slowest = sorted(took.items(), key=lambda kv: -kv[1])[:4]
        out["hostile"] = {"inputs": len(hostile.ROWS), "by_status": dict(sorted(statuses.items())),
                          "5xx": sum(n for s, n in statuses.items() if s >= 500),
                          "slowest_s": {k: round(v, 2) for k, v in slowest}, "worst_health_s": round(worst[0], 3)}
        t = time.monotonic()
        burst = asyncio.run(hostile._burst(server.url, args.burst))
        out["burst"] = {"clients": args.burst, "by_status": dict(collections.Counter(s for s, _ in burst)),
                        "seconds": round(time.monotonic() - t, 1)}
        assert_baseline(server.url, state)
        t = time.monotonic()
        outcomes = asyncio.run(storm._storm(server.url, args.storm))
        assert_baseline(server.url, state)
        out["storm"] = {"clients": args.storm, "outcomes": dict(collections.Counter(outcomes)),
                        "settled_s": round(time.monotonic() - t, 1)}
    rt.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
