"""What the front door lets a client hold: body size, time to send a request, open connections.

These bound the server's memory and connections whatever clients send, before any request is
authenticated. `hyperplan serve` sets them (README "Serving"); the defaults suit the JSON APIs, whose
largest legitimate bodies are tens of kilobytes; S3's bodies have their own cap and time bound.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


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

    s3_max_body_bytes: int = 5 * GIB
    """S3's requests (server/s3) bypass ``max_body_bytes``: their bodies are streamed to disk, never held
    in memory, up to this many bytes (decoded) a request: S3's own limit for one PutObject or part.
    A larger one is answered EntityTooLarge, before it is read when its length is declared."""

    s3_body_timeout: float = 3600.0
    """Seconds an S3 request's body may take in all; and, as for every route, no more than
    ``body_timeout`` seconds may pass without a byte of it."""


def describe_bytes(count: int) -> str:
    """`1048576 bytes (1 MiB)`: exact for the client, readable for a person."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if count >= size and count % size == 0:
            return f"{count} bytes ({count // size} {unit})"
    return f"{count} bytes"
