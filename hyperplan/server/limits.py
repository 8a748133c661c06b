"""What the front door lets a client hold: body size, time to send a request, open connections.

These bound the server's memory and connections whatever clients send, before any request is
authenticated. `hyperplan serve` sets them (README "Serving"); the defaults suit the API, whose largest
legitimate bodies are tens of kilobytes.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = MIB
    """A request body over this is answered 413 before it is read (by Content-Length) or as soon as
    it passes the cap (chunked), and its connection is closed."""

    header_timeout: float = 10.0
    """Seconds from a connection's opening (or its previous response) to a request's complete headers."""

    body_timeout: float = 30.0
    """Seconds from a request's headers to the end of its body; then 408 and the connection is closed."""

    max_connections: int = 128
    """Open connections (or requests in progress) beyond which a new request is answered 503 at once."""


def describe_bytes(count: int) -> str:
    """`1048576 bytes (1 MiB)`: exact for the client, readable for a person."""
    for unit, size in (("MiB", MIB), ("KiB", KIB)):
        if count >= size and count % size == 0:
            return f"{count} bytes ({count // size} {unit})"
    return f"{count} bytes"
