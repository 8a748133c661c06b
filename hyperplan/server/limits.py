"""What the front door lets a client hold: body size, time to send a request, open connections (in all,
and per client address).

These bound the server's memory and connections whatever clients send, before any request is
authenticated. `hyperplan serve` sets them (README "Serving"); the defaults suit the JSON APIs, whose
largest legitimate bodies are tens of kilobytes; S3's bodies have their own cap and time bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyperplan.errors import ValidationError

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
    """Open connections (its own among them) beyond which a request is answered 503 at once, in its API's
    error shape, as it is when this many requests are already in progress."""

    s3_max_body_bytes: int = 5 * GIB
    """S3's requests (server/s3) bypass ``max_body_bytes``: their bodies are streamed to disk, never held
    in memory, up to this many bytes (decoded) a request: S3's own limit for one PutObject or part.
    A larger one is answered EntityTooLarge, before it is read when its length is declared."""

    s3_body_timeout: float = 3600.0
    """Seconds an S3 request's body may take in all; and, as for every route, no more than
    ``body_timeout`` seconds may pass without a byte of it."""

    max_connections_per_address: int | None = None
    """Open connections one client address may hold (server/fair_connections.py); one more is answered 503
    as it opens. None: a quarter of ``max_connections`` (32 of 128), so that it takes four addresses to
    fill the server, and one address still has room for three clients' pools of ten (boto3's default)."""

    max_pending_per_address: int | None = None
    """Of those, connections waiting for a request's headers (new, or kept alive between requests): the
    cheapest to hold. None: half of the above (16 of 32): a browser's six and a boto3 pool's ten idle
    connections, while the rest of the address's share stays for requests in progress."""

    @property
    def connections_per_address(self) -> int:
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        return max(1, self.max_connections // 4)

    @property
    def pending_per_address(self) -> int:
        if self.max_pending_per_address is not None:
            return self.max_pending_per_address
        return max(1, self.connections_per_address // 2)

    def check(self) -> None:
        """The caps per address fit inside the server's: one address alone can never take every place
        (nor wait for headers on more connections than it may hold). A ValidationError otherwise."""
        if self.connections_per_address >= self.max_connections:
            raise ValidationError(
                f"--max-connections-per-address ({self.connections_per_address}) must be below "
                f"--max-connections ({self.max_connections}), or one address could take every place."
            )
        if self.pending_per_address > self.connections_per_address:
            raise ValidationError(
                f"--max-pending-per-address ({self.pending_per_address}) must not exceed "
                f"--max-connections-per-address ({self.connections_per_address}): those connections are "
                "among the open ones."
            )


def describe_bytes(count: int) -> str:
    """`1048576 bytes (1 MiB)`: exact for the client, readable for a person."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if count >= size and count % size == 0:
            return f"{count} bytes ({count // size} {unit})"
    return f"{count} bytes"
