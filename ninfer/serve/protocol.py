"""uvicorn's h11 connection with the two bounds uvicorn lacks: a header read timeout and a connection limit.

uvicorn times out only idle keep-alive connections; a client that sends its request line and headers a byte at a
time holds a connection forever. Here a request's headers must be complete within `--header-read-timeout` of its
first byte (else 408 and the connection closes). uvicorn's own `limit_concurrency` answers 503 in plain text; here
a connection beyond `--limit-concurrency` gets 503 in OpenAI's error envelope and is closed at once, and a request
h11 cannot parse gets its 400 in the envelope too.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import envelope
from .limits import ServeLimits


def raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 error response with the envelope, written before (or instead of) any ASGI cycle."""
    body = json.dumps(envelope(status, message, None, code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\nretry-after: 1\r\n\r\n")
    return head.encode("latin-1") + body


def bounded_protocol(limits: ServeLimits) -> type[H11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, closed over the server's limits."""

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _head_seen = 0  # bytes of the current request's line and headers so far
        _head_tail = b""  # the last bytes seen, in case the blank line ending the headers spans two reads

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.limit_concurrency:
                transport.write(raw_response(503, "Service Unavailable", "the server is at its connection limit "
                                             f"({limits.limit_concurrency}, --limit-concurrency)",
                                             "too_many_connections"))
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self._head_too_large(data):
                self.send_400_response("Request headers too large.")
                return
            super().data_received(data)
            # h11 stays IDLE until a request's headers are complete: arm on the first byte, disarm once they are.
            if self.conn.their_state is h11.IDLE:
                self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _head_too_large(self, data: bytes) -> bool:
            """h11 bounds only a head that arrives in pieces; one that arrives whole is measured here."""
            window = self._head_tail + data
            end = window.find(b"\r\n\r\n")
            seen = self._head_seen + (len(data) if end < 0 else end - len(self._head_tail))
            self._head_seen, self._head_tail = (seen, window[-3:]) if end < 0 else (0, b"")
            return seen > limits.max_header_bytes

        def send_400_response(self, msg: str) -> None:
            """A request h11 cannot parse (malformed, or headers over --h11-max-incomplete-event-size): the
            envelope instead of uvicorn's plain text."""
            if not self.transport.is_closing():
                self.transport.write(raw_response(400, "Bad Request", f"{msg} (malformed request line or headers, "
                                                  f"or more than {limits.max_header_bytes} bytes of them)",
                                                  "invalid_http"))
                self.transport.close()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(limits.header_read_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(raw_response(408, "Request Timeout", "the request headers did not arrive "
                                                  f"within {limits.header_read_timeout:g} s (--header-read-timeout)",
                                                  "header_read_timeout"))
                self.transport.close()

    return BoundedH11Protocol
