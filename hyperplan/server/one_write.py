"""A response's head and its body in one write to the socket, on uvicorn's httptools protocol.

uvicorn writes the status line and headers when the app sends ``http.response.start``, and the body
when it sends ``http.response.body``: two writes, so two ``send`` system calls and two TCP segments
over the loopback or the network, for an answer that is almost always a few hundred bytes. Each
segment costs the server's kernel its way through the TCP stack and wakes the client once more; that
second write was a tenth of a search's server CPU under load.

`HeadWithBody` stands in for the transport of one request's cycle (server/header_deadline.py puts
it there): it holds the head back and writes it with the first bytes of the body. Only a head whose
length is known (``Content-Length``) is held, whose body therefore follows at once (every answer of
this server's: none streams an unknown length), and never for HEAD, which has no body to wait for.
Everything else goes straight through: the ``100 Continue`` a client waits for before sending its
body (written before any response starts), and whatever comes after the head. A close, or the end of
the response, writes a held head first, so nothing written is ever lost or reordered.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class _Cycle(Protocol):
    """What uvicorn's request-response cycle shows of its response (httptools_impl)."""

    scope: Any
    response_started: bool
    chunked_encoding: bool | None


class HeadWithBody:
    """The cycle's view of the connection's transport: a fixed-length response's head held until its
    body's first write, then both in one. Any other attribute is the transport's own."""

    __slots__ = ("_cycle", "_head_done", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: _Cycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._held: bytes | None = None
        self._head_done = False  # the one write held back is the head: the first after the start

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._head_done or not self._cycle.response_started:
            self._transport.write(data)  # the body's later writes; a 100 Continue before the start
        else:
            self._head_done = True
            cycle = self._cycle
            if cycle.chunked_encoding is False and cycle.scope.get("method") != "HEAD":
                self._held = data  # its body's first write follows at once
            else:
                self._transport.write(data)

    def flush(self) -> None:
        """Write a head still held (a response that ended without a body write)."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
