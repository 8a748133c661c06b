"""uvicorn's HTTP/1.1 protocols, plus a deadline for a request's headers and fair shares of connections.

uvicorn arms no timer between accepting a connection and the end of a request's headers: its keep-alive
timer runs only after a response, and is dropped at the first byte of the next request. A client that
connects and sends nothing, or half its headers, would hold the connection, and a place under the
connection cap, for as long as it likes. The app is called only once the headers are complete, so an
ASGI middleware cannot see such a client: the deadline has to live here, as the smallest addition to
uvicorn's own protocol. h11 already bounds the headers' size (16 KiB), so a client cannot grow the
server's memory while it is being slow.

The deadline alone still let one client hold every place: connections renewed before their deadline
cost nothing. So the protocol also keeps each client address to its share (server/fair_connections.py):
a connection over its address's cap is refused as it opens, before a byte of it is read; and it takes
over uvicorn's cap on all connections (its `limit_concurrency`, which answered in plain text), checked
when a request's headers are in, as uvicorn did, and refused in that request's API's error shape.

Two protocols, the same rules: on httptools (a C parser, installed with hyperplan: about a quarter of a
millisecond less CPU per request than the pure-Python h11, a good share of a search's cost) the header
size bound is added here too, as h11's (16 KiB received while the headers are incomplete); on h11
where httptools is not installed.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

import h11
from starlette.responses import Response
from starlette.types import ASGIApp, Scope
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from hyperplan.errors import ServiceUnavailable
from hyperplan.server.errors import (
    before_any_request_error_response,
    error_response_for_path,
    s3_error_response,
    sts_error_response,
)
from hyperplan.server.fair_connections import AddressLedger, RefusalLog, Seat, TrustedProxies
from hyperplan.server.limits import ServerLimits
from hyperplan.server.request_ids import new_request_id
from hyperplan.server.routing import is_s3, json_api

log = logging.getLogger(__name__)

_DEFAULTS = ServerLimits()


class FairShares:
    """What both protocols add to uvicorn's for the connection caps. The class attributes are set per
    server by `front_door_protocol`; the hooks are called from the protocols' own methods."""

    max_connections: int = _DEFAULTS.max_connections
    ledger: AddressLedger = AddressLedger(_DEFAULTS.connections_per_address, _DEFAULTS.pending_per_address)
    trusted_proxies: TrustedProxies = TrustedProxies()
    refusals: RefusalLog = RefusalLog()

    seat: Seat | None = None  # None: not counted (no peer address, or refused as it opened)
    _app: Any = None

    # uvicorn's protocol's, which this is mixed into.
    client: tuple[str, int] | None
    scope: Any
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    tasks: set[Any]
    server_state: ServerState

    @property
    def app(self) -> ASGIApp:
        """What uvicorn runs for the request whose headers just came in. Both of uvicorn's HTTP/1.1
        protocols read this once per request, after parsing its line and headers into `self.scope` and
        before starting anything: the one point they share where the request is known and nothing of
        it has run (uvicorn's own cap is checked there too). The request's client is settled here, and
        the caps checked."""
        try:
            self._settle_client()
            self._check_server_cap()
        except ServiceUnavailable as refused:
            self.refusals.note(self.loop.time(), refused.message)
            return refusal_in_the_requests_shape(self.scope, refused)
        return self._app

    @app.setter
    def app(self, app: ASGIApp) -> None:  # uvicorn's __init__ sets the loaded app here
        self._app = app

    def _take_seat(self, transport: asyncio.Transport) -> bool:
        """At the opening: the connection's seat; or, its address holding its share already, the refusal
        sent and the connection closed, before a byte of it is read. Returns whether it was admitted."""
        peer = self.client[0] if self.client else None
        if peer is None:  # no address (a Unix socket): nobody's to count
            return True
        if self.trusted_proxies and self.trusted_proxies.trusts(peer):
            self.seat = AddressLedger.proxied()
            return True
        try:
            self.seat = self.ledger.admit(peer)
        except ServiceUnavailable as refused:
            self.refusals.note(self.loop.time(), refused.message)
            transport.write(refusal_at_opening(refused, self.server_state.default_headers))
            transport.close()
            return False
        return True

    def _waiting_for_headers(self, waiting: bool) -> None:
        if self.seat is not None:
            self.ledger.wait_for_headers(self.seat, waiting)

    def _settle_client(self) -> None:
        """A trusted proxy's request: its client from X-Forwarded-For (scope["client"], which the audit
        trail and the console read) and its scheme from X-Forwarded-Proto; the connection then counts
        against that client until the response. Anybody else's headers name nobody."""
        seat = self.seat
        if seat is None or self.client is None:
            return
        peer = self.client[0]
        if not seat.proxied:
            if not self.refusals.forwarding_ignored and _forwarding(self.scope["headers"])[0]:
                self.refusals.forwarding_from(peer)
            return
        forwarded_for, forwarded_proto = _forwarding(self.scope["headers"])
        client = self.trusted_proxies.forwarded_client(peer, forwarded_for)
        self.scope["client"] = (client, 0)  # the port the client used is the proxy's to know
        self.scope["scheme"] = self.trusted_proxies.forwarded_scheme(forwarded_proto, self.scope["scheme"])
        self.ledger.carry(seat, client)

    def _check_server_cap(self) -> None:
        """uvicorn's cap, checked where uvicorn checked it, but with `>` for its `>=`: up to
        max_connections connections, this one among them, are served (uvicorn served one fewer)."""
        if len(self.connections) > self.max_connections or len(self.tasks) >= self.max_connections:
            raise ServiceUnavailable(
                f"The server already holds its most connections or requests ({self.max_connections}); "
                "try again shortly."
            )

    def _request_answered(self) -> None:
        """A proxy's connection is nobody's between requests (its next may be another client's). A proxy
        that pipelined its requests would have its connection counted for nobody from the first
        response to the end of the second request: too little, never too much."""
        if self.seat is not None and self.seat.proxied:
            self.ledger.carry(self.seat, None)

    def _release_seat(self) -> None:
        if self.seat is not None:
            self.ledger.release(self.seat)
            self.seat = None


def _forwarding(headers: list[tuple[bytes, bytes]]) -> tuple[list[str], list[str]]:
    """X-Forwarded-For's and X-Forwarded-Proto's values, each in the order received, in one pass
    (servers give names in lower case)."""
    forwarded_for: list[str] = []
    forwarded_proto: list[str] = []
    for name, value in headers:
        if name == b"x-forwarded-for":
            forwarded_for.append(value.decode("latin-1"))
        elif name == b"x-forwarded-proto":
            forwarded_proto.append(value.decode("latin-1"))
    return forwarded_for, forwarded_proto


def refusal_at_opening(refused: ServiceUnavailable, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 response for a connection refused as it opens, when no request has been read and
    none will be: 503 ServiceUnavailable in both JSON shapes (errors.before_any_request_error_response),
    which boto3 reads as a ClientError for SageMaker and CloudWatch Logs, and our client for the native
    API. Writing it costs one small write into an empty socket buffer: it never waits on the client."""
    response = before_any_request_error_response(refused, new_request_id())
    status = HTTPStatus(response.status_code)
    head = [f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode()]
    for name, value in [*default_headers, *response.raw_headers, (b"connection", b"close")]:
        head += [name, b": ", value, b"\r\n"]
    return b"".join([*head, b"\r\n", response.body])


def refusal_in_the_requests_shape(scope: Scope, refused: ServiceUnavailable) -> Response:
    """The refusal of a request whose headers are in, as its API answers errors (an ASGI app): S3's XML,
    STS's XML, the native API's JSON, awsJson1.1 for the rest; the connection closed after it."""
    request_id = new_request_id()
    response: Response
    if is_s3(scope):
        response = s3_error_response(refused, request_id, head=scope["method"] == "HEAD")
    elif scope["method"] == "POST" and scope["path"] == "/" and json_api(scope) is None:
        response = sts_error_response(refused, request_id)
    else:
        response = error_response_for_path(scope["path"], refused, request_id)
    response.headers["connection"] = "close"  # uvicorn closes it once answered; the body is never read
    return response


class HeaderDeadlineProtocol(FairShares, H11Protocol):
    header_timeout: float = ServerLimits.header_timeout

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limit_concurrency = None  # the cap is FairShares', answered in the API's shape
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._take_seat(transport):
            self._follow_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        self._request_answered()
        super().on_response_complete()  # starts the next request on a kept-alive connection
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._release_seat()
        super().connection_lost(exc)

    def _follow_request(self) -> None:
        """The deadline runs while h11 waits for a request (the client's IDLE state). It starts once per
        request, so bytes trickled in do not renew it, and it stops when the headers are in."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._cancel_deadline()
        elif self.header_deadline is None:
            self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_late)
            self._waiting_for_headers(True)

    def _headers_too_late(self) -> None:
        self.header_deadline = None
        if self.conn.their_state is h11.IDLE:
            log.debug("closing %s: no complete request headers within %g s", self.client, self.header_timeout)
            self.transport.close()

    def _cancel_deadline(self) -> None:
        self._waiting_for_headers(False)
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None


MAX_HEADER_BYTES = 16 * 1024
"""Bytes received while a request's line and headers are not complete (h11's bound), on httptools."""


def _httptools_protocol() -> type[Any] | None:
    """The httptools protocol with the deadline, the size bound and the shares; None when httptools is
    missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HttpToolsDeadlineProtocol(FairShares, HttpToolsProtocol):
        """The deadline runs while the protocol waits for a request's headers and no response is due:
        from the connection's opening, and from each response on a kept-alive connection whose next
        request's headers have not come yet; it is started once per request and stopped by the
        headers. That is also when the connection counts as waiting for headers."""

        header_timeout: float = ServerLimits.header_timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # the cap is FairShares', answered in the API's shape
            self.header_deadline: asyncio.TimerHandle | None = None
            self.awaiting_headers = True  # the next bytes are a request's line and headers
            self.header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self._take_seat(transport):
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
            super().on_headers_complete()  # reads self.app: FairShares.app

        def on_message_complete(self) -> None:
            self.awaiting_headers, self.header_bytes = True, 0  # what follows is the next request
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._request_answered()
            super().on_response_complete()
            if self.awaiting_headers and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            self._release_seat()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self.header_deadline is None and not self.transport.is_closing():
                self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_late)
                self._waiting_for_headers(True)

        def _headers_too_late(self) -> None:
            self.header_deadline = None
            if self.awaiting_headers:
                log.debug(
                    "closing %s: no complete request headers within %g s", self.client, self.header_timeout
                )
                self.transport.close()

        def _cancel_deadline(self) -> None:
            self._waiting_for_headers(False)
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

    return HttpToolsDeadlineProtocol


_HTTPTOOLS = _httptools_protocol()


def front_door_protocol(
    limits: ServerLimits, proxies: TrustedProxies = TrustedProxies(), *, parser: str = "auto"
) -> type[Any]:
    """The protocol class for uvicorn's `http=` option (uvicorn's own `limit_concurrency` is then
    ignored: the cap is `limits.max_connections`), with the header deadline and the caps of `limits`
    and the proxies trusted to name clients; one ledger of connections per call (per server). On
    httptools when it is installed (`parser` "auto"), else, or with `parser` "h11", on h11. Give uvicorn
    `proxy_headers=False` with it (serving.serve does): uvicorn's own reading of X-Forwarded-For trusts
    loopback by default, so any local process could name any client."""
    base = _HTTPTOOLS if parser == "auto" and _HTTPTOOLS is not None else HeaderDeadlineProtocol

    class Configured(base):  # type: ignore[valid-type, misc]
        header_timeout = limits.header_timeout
        max_connections = limits.max_connections
        ledger = AddressLedger(limits.connections_per_address, limits.pending_per_address)
        trusted_proxies = proxies
        refusals = RefusalLog()

    return Configured
