"""uvicorn's HTTP/1.1 protocol, plus a deadline for a request's headers.

uvicorn (its h11 protocol, the one used without httptools) arms no timer between accepting a connection
and the end of a request's headers: its keep-alive timer runs only after a response, and is dropped at
the first byte of the next request. A client that connects and sends nothing, or half its headers, would
hold the connection, and a place under the connection cap, for as long as it likes. The app is called
only once the headers are complete, so an ASGI middleware cannot see such a client: the deadline has to
live here, as the smallest addition to uvicorn's own protocol. h11 already bounds the headers' size
(16 KiB), so a client cannot grow the server's memory while it is being slow.
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


def header_deadline_protocol(timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn's `http=` option, with this deadline in seconds."""

    class Configured(HeaderDeadlineProtocol):
        header_timeout = timeout

    return Configured
