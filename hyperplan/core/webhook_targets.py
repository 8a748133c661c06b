"""Which addresses the server may send a webhook to.

A webhook makes the server open a connection to an address someone typed in. Unless the fleet file says
otherwise, only public addresses are allowed, so that a webhook cannot reach what only the server can
reach: its own loopback services, the private network it sits in, or a cloud metadata service on the
link-local 169.254.169.254. Refused unless allowed: unspecified (0.0.0.0, ::), loopback, link-local,
private (RFC 1918, fc00::/7), shared (100.64.0.0/10), multicast, and every other range that is not
globally routable. IPv6 forms that carry an IPv4 address (::ffff:a.b.c.d, ::a.b.c.d, 6to4, NAT64,
Teredo) are judged by that address too.

The fleet file's ``[webhooks] allowed_networks`` lists networks that are allowed all the same: say an
internal receiver's ``10.20.0.0/16``, or ``127.0.0.0/8`` for a receiver on the same machine.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class WebhookTargets:
    allowed_networks: tuple[IPNetwork, ...] = ()

    def refusal(self, address: IPAddress) -> str | None:
        """Why the server may not connect to ``address``; None if it may."""
        for candidate in _judged(address):
            if any(candidate in network for network in self.allowed_networks):
                continue
            kind = _non_public_kind(candidate)
            if kind is not None:
                shown = str(address) if candidate == address else f"{address} (that is {candidate})"
                return f"{shown} is {kind}"
        return None


def parse_networks(values: list[object], where: str) -> tuple[IPNetwork, ...]:
    """``["127.0.0.0/8", "::1"]`` -> networks; a ValueError names the entry that is not one."""
    networks: list[IPNetwork] = []
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"{where}[{index}]: {value!r} is not a network such as 10.0.0.0/8")
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{where}[{index}]: {value!r} is not a network such as 10.0.0.0/8") from None
    return tuple(networks)


def _judged(address: IPAddress) -> Iterator[IPAddress]:
    """The address a connection really goes to, and every IPv4 address the IPv6 form carries."""
    if isinstance(address, ipaddress.IPv4Address):
        yield address
        return
    if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d on a dual-stack socket
        yield address.ipv4_mapped
        return
    yield address
    if address.sixtofour is not None:
        yield address.sixtofour
    if address.teredo is not None:
        yield from address.teredo
    low = int(address) & 0xFFFFFFFF
    if int(address) >> 32 == 0 and int(address) > 1:  # ::a.b.c.d, the old IPv4-compatible form
        yield ipaddress.IPv4Address(low)
    if address in _NAT64:
        yield ipaddress.IPv4Address(low)


def _non_public_kind(address: IPAddress) -> str | None:
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None
