"""Fair shares of the server's connections: no client address holds more than its part of them.

The server's cap on connections (--max-connections) is one count for everybody. A client that opened
connections and sent half a request's headers, again and again within the header deadline, held every
place, and every other client, the health check included, was refused. So each client address has two
caps of its own, well under the server's (ServerLimits): on the connections it holds open, and on those of
them that wait for a request's headers (a new connection, or a kept-alive one between two requests: the
state the header deadline bounds, and the one that costs a client nothing to hold).

Whose a connection is: its peer's, unless the peer is a trusted proxy (--trusted-proxy); then the client
is the one the proxy names in X-Forwarded-For, known only once a request's headers are in. So:

- a direct client's connection counts against the peer's address from its opening to its close, for both
  caps, and one over either cap is refused as it opens, before a byte of it is read;
- a trusted proxy's connection counts against the forwarded client's address only while it carries that
  client's request (from the request's headers to its response: a proxy's kept-alive connection carries
  many clients' requests in turn), and only for the cap on open connections: a request over it is
  refused. The cap on connections waiting for headers does not apply to a proxy's (before the headers
  nobody knows whose a connection will be; a proxy reads a request's headers whole before it forwards
  them, and keeps its own clients' waits to itself).

This module is the pure part (no sockets, no clock): which address is the client's, and the counts.
server/header_deadline.py applies it in uvicorn's protocols, on the event loop of its process: nothing
here is locked, and each process of `serve --workers N` counts its own connections, as it does for
--max-connections.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from hyperplan.errors import ServiceUnavailable, ValidationError

log = logging.getLogger(__name__)

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network


def parse_address(text: str) -> Address | None:
    """An IP address, or None. An IPv4 address in IPv6 clothes (``::ffff:10.0.0.1``, a dual-stack
    socket's peer) is the IPv4 address: one client, one count."""
    try:
        address = ip_address(text)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def forwarded_address(hop: str) -> Address | None:
    """One entry of X-Forwarded-For: ``10.0.0.1``, ``10.0.0.1:5000``, ``2001:db8::1`` or
    ``[2001:db8::1]:5000``; None for anything else (``unknown``, a name, an IPv6 zone)."""
    hop = hop.strip()
    if hop.startswith("["):
        host, closed, _ = hop[1:].partition("]")
        hop = host if closed else ""
    elif hop.count(":") == 1:  # IPv4 with a port (a bare IPv6 address has several colons)
        hop = hop.partition(":")[0]
    address = parse_address(hop)
    # A zone names an interface of the proxy's, no client's; and its length is the sender's to choose.
    if isinstance(address, IPv6Address) and address.scope_id is not None:
        return None
    return address


class TrustedProxies:
    """The reverse proxies whose word on the client's address (X-Forwarded-For) and scheme
    (X-Forwarded-Proto) the server takes; every other peer's headers count for nothing."""

    def __init__(self, networks: Iterable[Network] = ()) -> None:
        self.networks = tuple(networks)
        # Parsing an address costs microseconds, more than the rest of a request's checks here; the same
        # few (peers, proxies, a proxy's clients) come again and again. Bounded: a stranger's entries
        # only cost their parsing again.
        self._trusted = functools.lru_cache(maxsize=4096)(self._trusts_text)
        self._hop = functools.lru_cache(maxsize=4096)(self._read_hop)

    @classmethod
    def parse(cls, values: Iterable[str]) -> TrustedProxies:
        """From --trusted-proxy's values, each one or more addresses or CIDR blocks separated by commas or
        blanks. A ValidationError names one that is neither, or a block with host bits set
        (``10.0.0.1/8``: a slip for ``10.0.0.0/8``, or for ``10.0.0.1``; trusting the wrong one would
        let anybody there name any address)."""
        networks: list[Network] = []
        for value in values:
            for item in value.replace(",", " ").split():
                try:
                    networks.append(ip_network(item))
                except ValueError as exc:
                    raise ValidationError(
                        f"--trusted-proxy {item!r} is not an IP address or a CIDR block ({exc})."
                    ) from None
        return cls(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, peer: str) -> bool:
        return bool(self.networks) and self._trusted(peer)

    def _trusts_text(self, text: str) -> bool:
        address = parse_address(text)
        return address is not None and self._trusts(address)

    def _trusts(self, address: Address) -> bool:
        return any(address in network for network in self.networks)

    def _read_hop(self, hop: str) -> tuple[str | None, bool]:
        """An X-Forwarded-For entry's address, written as Python writes it (one client, one spelling),
        and whether it is a trusted proxy's; (None, False) for no address."""
        address = forwarded_address(hop)
        if address is None:
            return None, False
        return str(address), self._trusts(address)

    def forwarded_client(self, proxy: str, forwarded_for: Sequence[str]) -> str:
        """The client a trusted `proxy` names: the right-most address listed that is not a trusted
        proxy's. Each proxy appends the address it got the request from, so that one was written by a
        proxy we trust, and everything left of it could have been written by anybody. The left-most
        when every address listed is a trusted proxy's (the request began there); the proxy itself when
        there is no header, or the entry chosen is no address."""
        hops = [hop for value in forwarded_for for hop in value.split(",") if hop.strip()]
        for hop in reversed(hops):
            address, trusted = self._hop(hop)
            if address is None:
                return proxy
            if not trusted:
                return address
        first = self._hop(hops[0])[0] if hops else None
        return first if first is not None else proxy

    @staticmethod
    def forwarded_scheme(forwarded_proto: Sequence[str], scheme: str) -> str:
        """A trusted proxy's X-Forwarded-Proto (its last value: http or https), else the connection's own
        `scheme` (the console's cookies are Secure when it is https)."""
        if not forwarded_proto:
            return scheme
        said = forwarded_proto[-1].rpartition(",")[2].strip().lower()
        return said if said in ("http", "https") else scheme


@dataclass(eq=False, slots=True)
class Seat:
    """One connection's place in the ledger."""

    address: str | None
    """The client address it counts against now; None: nobody's (a proxy's connection between requests)."""
    proxied: bool = False
    """A trusted proxy's: attributed request by request, never counted as waiting for headers."""
    pending: bool = False
    """Counted as waiting for a request's headers."""


class AddressLedger:
    """Connections open, and waiting for a request's headers, per client address; each count is there
    only while it is above zero, so the ledger is as large as the connections open."""

    def __init__(self, max_open: int, max_pending: int) -> None:
        self.max_open = max_open
        self.max_pending = max_pending
        self._open: dict[str, int] = {}
        self._pending: dict[str, int] = {}

    def __len__(self) -> int:
        """How many addresses hold a connection now."""
        return len(self._open.keys() | self._pending.keys())

    def open_count(self, address: str) -> int:
        return self._open.get(address, 0)

    def pending_count(self, address: str) -> int:
        return self._pending.get(address, 0)

    def admit(self, address: str) -> Seat:
        """A direct client's new connection, waiting for its first request's headers; ServiceUnavailable
        if its address already holds its share of either kind."""
        if self.open_count(address) >= self.max_open:
            raise ServiceUnavailable(_over_open_cap(address, self.max_open))
        if self.pending_count(address) >= self.max_pending:
            raise ServiceUnavailable(
                f"{address} already holds {self.max_pending} connections that have sent no request's "
                "headers, the most one client address may hold here: send a request on one of them, or "
                "close one, and try again."
            )
        seat = Seat(address)
        _add(self._open, address, 1)
        self.wait_for_headers(seat, True)
        return seat

    @staticmethod
    def proxied() -> Seat:
        """A trusted proxy's new connection: nobody's until it carries a request."""
        return Seat(None, proxied=True)

    def wait_for_headers(self, seat: Seat, waiting: bool) -> None:
        """A direct client's connection starts (a new one, or the last response sent) or stops (the
        headers are in, or it is closing) waiting for a request's headers."""
        if seat.proxied or seat.address is None or seat.pending == waiting:
            return
        seat.pending = waiting
        _add(self._pending, seat.address, 1 if waiting else -1)

    def carry(self, seat: Seat, address: str | None) -> None:
        """A proxy's connection now carries a request of the client at `address` (None: none, its response
        sent). ServiceUnavailable, and the connection nobody's, if that address already holds its share."""
        if seat.address == address:
            return
        if seat.address is not None:
            _add(self._open, seat.address, -1)
            seat.address = None
        if address is not None:
            if self.open_count(address) >= self.max_open:
                raise ServiceUnavailable(_over_open_cap(address, self.max_open))
            _add(self._open, address, 1)
            seat.address = address

    def release(self, seat: Seat) -> None:
        """The connection closed."""
        self.wait_for_headers(seat, False)
        if seat.address is not None:
            _add(self._open, seat.address, -1)
            seat.address = None


def _add(counts: dict[str, int], address: str, change: int) -> None:
    count = counts.get(address, 0) + change
    if count > 0:
        counts[address] = count
    else:
        counts.pop(address, None)


def _over_open_cap(address: str, cap: int) -> str:
    return (
        f"{address} already holds {cap} open connections, the most one client address may hold here; "
        "try again once one of them has closed."
    )


class RefusalLog:
    """Refusals of connections and requests written to the log at most once a minute (a flood must not
    flood the log too): how many since the last line, and the last one's reason."""

    EVERY = 60.0

    def __init__(self) -> None:
        self.unlogged = 0
        self.logged_at: float | None = None
        self.forwarding_ignored = False  # said once: X-Forwarded-For from a peer that is no trusted proxy

    def note(self, now: float, reason: str) -> None:
        """`now`: a monotonic time in seconds (the event loop's)."""
        self.unlogged += 1
        if self.logged_at is None or now - self.logged_at >= self.EVERY:
            log.warning(
                "refused %d connection(s) or request(s) over the connection caps since the last such line; "
                "the last: %s",
                self.unlogged,
                reason,
            )
            self.unlogged, self.logged_at = 0, now

    def forwarding_from(self, peer: str) -> None:
        """A request from `peer`, which is no trusted proxy, named a client in X-Forwarded-For."""
        if self.forwarding_ignored:
            return
        self.forwarding_ignored = True
        log.warning(
            "a request from %s carries X-Forwarded-For, ignored: %s is not a trusted proxy "
            "(--trusted-proxy). Behind a reverse proxy not named there, every client counts as the "
            "proxy's one address, for the connection caps and the audit trail alike.",
            peer,
            peer,
        )
