"""uvicorn's HTTP/1.1 protocols, plus a deadline for a request's headers.

uvicorn arms no timer between accepting a connection and the end of a request's headers: its keep-alive
timer runs only after a response, and is dropped at the first byte of the next request. A client that
connects and sends nothing, or half its headers, would hold the connection, and a place under the
connection cap, for as long as it likes. The app is called only once the headers are complete, so an
ASGI middleware cannot see such a client: the deadline has to live here, as the smallest addition to
uvicorn's own protocol. h11 already bounds the headers' size (16 KiB), so a client cannot grow the
server's memory while it is being slow.

Two protocols, the same rules: on httptools (a C parser, installed with hyperplan: about a quarter of a
millisecond less CPU per request than the pure-Python h11, a good share of a search's cost) the header
size bound is added here too, as h11's (16 KiB received while the headers are incomplete); on h11
where httptools is not installed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from hyperplan.server.limits import ServerLimits

log = logging.getLogger(__name__)


class HeaderDeadlineProtocol(H11Protocol):
    header_timeout: float = ServerLimits.header_timeout

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next request on a kept-alive connection
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _follow_request(self) -> None:
        """The deadline runs while h11 waits for a request (the client's IDLE state). It starts once per
        request, so bytes trickled in do not renew it, and it stops when the headers are in."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._cancel_deadline()
        elif self.header_deadline is None:
            self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_late)

    def _headers_too_late(self) -> None:
        self.header_deadline = None
        if self.conn.their_state is h11.IDLE:
            log.debug("closing %s: no complete request headers within %g s", self.client, self.header_timeout)
            self.transport.close()

    def _cancel_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None


MAX_HEADER_BYTES = 16 * 1024
"""Bytes received while a request's line and headers are not complete (h11's bound), on httptools."""


def _httptools_protocol() -> type[Any] | None:
    """The httptools protocol with the deadline and the size bound; None when httptools is missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HttpToolsDeadlineProtocol(HttpToolsProtocol):
        """The deadline runs while the protocol waits for a request's headers and no response is due:
        from the connection's opening, and from each response on a kept-alive connection whose next
        request's headers have not come yet; it is started once per request and stopped by the
        headers."""

        header_timeout: float = ServerLimits.header_timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.header_deadline: asyncio.TimerHandle | None = None
            self.awaiting_headers = True  # the next bytes are a request's line and headers
            self.header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.awaiting_headers:
                self.header_bytes += len(data)
            super().data_received(data)
            # Still no end of the headers (httptools keeps what it has of them): past the bound, refused.
            too_much = self.awaiting_headers and self.header_bytes > MAX_HEADER_BYTES
            if too_much and not self.transport.is_closing():
                self.send_400_response(f"Request line and headers over {MAX_HEADER_BYTES} bytes.")

        def on_headers_complete(self) -> None:
            self.awaiting_headers = False
            self._cancel_deadline()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self.awaiting_headers, self.header_bytes = True, 0  # what follows is the next request
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.awaiting_headers and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self.header_deadline is None and not self.transport.is_closing():
                self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_late)

        def _headers_too_late(self) -> None:
            self.header_deadline = None
            if self.awaiting_headers:
                log.debug(
                    "closing %s: no complete request headers within %g s", self.client, self.header_timeout
                )
                self.transport.close()

        def _cancel_deadline(self) -> None:
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

    return HttpToolsDeadlineProtocol


_HTTPTOOLS = _httptools_protocol()


def header_deadline_protocol(timeout: float, *, parser: str = "auto") -> type[Any]:
    """The protocol class for uvicorn's `http=` option, with this deadline in seconds: on httptools when
    it is installed (`parser` "auto"), else, or with `parser` "h11", on h11."""
    base = _HTTPTOOLS if parser == "auto" and _HTTPTOOLS is not None else HeaderDeadlineProtocol

    class Configured(base):  # type: ignore[valid-type, misc]
        header_timeout = timeout

    return Configured
