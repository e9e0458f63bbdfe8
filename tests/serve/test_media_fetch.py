"""Remote image fetches behind --allow-remote-media, against a local HTTP server: the bytes arrive; a body over the
byte limit (with or without a Content-Length), a slow drip or a stall past the timeout, a redirect and an error
status are 400s naming the part; with the flag off nothing is fetched; a client that leaves ends a stalled fetch at
once (499); images over --limit-mm-per-prompt, or any when the server takes none, are refused before any fetch."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ninfer.serve.errors import APIError
from ninfer.frontend.grammar.workers import cancellable
from ninfer.serve.media import MediaPolicy, acquire_messages, fetch

LIMIT = 1000
STALL_S = 20.0


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        _Handler.hits.append(self.path)
        if self.path == "/ok":
            self._send(200, b"x" * LIMIT)
        elif self.path == "/big":
            self._send(200, b"x" * (LIMIT + 1))
        elif self.path == "/unsized":  # no Content-Length: the body ends when the connection closes
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * (50 * LIMIT))
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(20):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path == "/stall":  # headers, then nothing for longer than any test waits
            self.send_response(200)
            self.end_headers()
            self.wfile.flush()
            time.sleep(STALL_S)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.end_headers()
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture(scope="module")
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


POLICY = MediaPolicy(allow_remote=True, max_bytes=LIMIT, fetch_timeout=0.5)


def test_fetch_within_limits(base):
    assert fetch(f"{base}/ok", "p", POLICY) == b"x" * LIMIT


@pytest.mark.parametrize("path, needle", [("/big", "over the limit of 1000 bytes"),
                                          ("/unsized", "over the limit of 1000 bytes"), ("/slow", "took over 0.5 s"),
                                          ("/stall", "took over 0.5 s"),
                                          ("/redirect", "HTTP 302"), ("/missing", "HTTP 404")])
def test_remote_violations_are_400s(base, path, needle):
    with pytest.raises(APIError) as e:
        fetch(f"{base}{path}", "messages[0].content[1]", POLICY)
    assert e.value.status == 400 and needle in e.value.message and "messages[0].content[1]" in e.value.message


def test_flag_off_fetches_nothing(base):
    _Handler.hits.clear()
    with pytest.raises(APIError, match="--allow-remote-media"):
        fetch(f"{base}/ok", "p", MediaPolicy(max_bytes=LIMIT))
    assert _Handler.hits == []


@pytest.mark.parametrize("url", ["http://[::1/x.png", "file://[x/a.png"])
def test_malformed_url_is_a_400(url):
    with pytest.raises(APIError, match="malformed") as e:
        fetch(url, "messages[0].content[0]", POLICY)
    assert e.value.status == 400


def test_url_httpx_refuses_is_a_400():
    with pytest.raises(APIError, match="InvalidURL") as e:
        fetch("http://\x01x/a.png", "messages[0].content[0]", POLICY)
    assert e.value.status == 400


def test_a_client_leaving_ends_a_stalled_fetch(base):
    """The preparation pool sets the request's cancel event when its client leaves: the fetch's wait ends at once
    (well before the stalled read's own 10 s timeout), with the 499 the Gateway answers a departed client with."""
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(APIError) as e, cancellable(cancel):
        fetch(f"{base}/stall", "p", MediaPolicy(allow_remote=True, max_bytes=LIMIT, fetch_timeout=10.0))
    assert e.value.status == 499 and time.monotonic() - t0 < 5.0


def _parts(base: str, n: int) -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": f"{base}/ok"}} for _ in range(n)]


def test_images_are_counted_before_any_fetch(base):
    _Handler.hits.clear()
    messages = [{"role": "user", "content": _parts(base, 2)}, {"role": "user", "content": _parts(base, 1)}]
    with pytest.raises(APIError) as e:
        acquire_messages(messages, MediaPolicy(allow_remote=True, max_bytes=LIMIT, max_images=2))
    assert e.value.status == 400 and "3 images in one request, over the limit of 2" in e.value.message
    assert e.value.param == "messages[1].content[0]" and _Handler.hits == []
    refused = MediaPolicy(allow_remote=True, max_bytes=LIMIT, refusal="this server takes no images")
    with pytest.raises(APIError, match=r"messages\[0\].content\[0\] is an image part; this server takes no"):
        acquire_messages(messages, refused)
    assert _Handler.hits == []
    fetched = acquire_messages(messages[:1], MediaPolicy(allow_remote=True, max_bytes=LIMIT, max_images=2))
    assert [p["image"].data for p in fetched[0]["content"]] == [b"x" * LIMIT] * 2 and len(_Handler.hits) == 2
