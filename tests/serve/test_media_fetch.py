"""Remote image fetches behind --allow-remote-media, against a local HTTP server: the bytes arrive; a body over the
byte limit (with or without a Content-Length), a slow drip past the timeout, a redirect and an error status are 400s
naming the part; with the flag off nothing is fetched."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ninfer.serve.errors import APIError
from ninfer.serve.media import MediaPolicy, fetch

LIMIT = 1000


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
