"""The HTTP client that sends webhooks and connects only to addresses the fleet allows.

Checking a URL when it is registered is not enough: a name can resolve to another address tomorrow (or
to another one at each lookup, which is how DNS rebinding works). So the check is made where the
connection is made. The client's network backend resolves the host itself, refuses the connection if
any address it resolves to is refused by :class:`~hyperplan.core.webhook_targets.WebhookTargets`, and
otherwise connects to exactly the addresses it checked, never resolving the name again. TLS still
verifies the certificate against the URL's host name.

Environment proxies (HTTP_PROXY, ...) are not used: through a proxy, the proxy would choose the address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import httpx

from hyperplan.core.webhook_targets import IPAddress, WebhookTargets


class TargetRefused(httpcore.ConnectError):
    """The webhook's host is, or resolves to, an address the fleet file does not allow."""


class GuardedBackend(httpcore.NetworkBackend):
    def __init__(self, targets: WebhookTargets, inner: httpcore.NetworkBackend | None = None) -> None:
        self.targets = targets
        self.inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = _resolve(host, port)
        for address in addresses:
            reason = self.targets.refusal(address)
            if reason is not None:
                raise TargetRefused(
                    f"refused to connect to {host}: {reason}; the fleet file's [webhooks] allowed_networks "
                    "does not allow it"
                )
        failure: httpcore.ConnectError | None = None
        for address in addresses:  # the checked addresses, in the resolver's order, never the name again
            try:
                return self.inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as error:
                failure = error
        assert failure is not None  # _resolve returns at least one address
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise TargetRefused("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise httpcore.ConnectError(f"cannot resolve {host}: {error}") from None
    addresses: list[IPAddress] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # without an IPv6 zone
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise httpcore.ConnectError(f"cannot resolve {host}: no addresses")
    return addresses


def guarded_client(targets: WebhookTargets) -> httpx.Client:
    """An httpx client whose every connection is checked against ``targets``."""
    # One TLS context for the transport and the pool: each loads the system's CA certificates, tens of
    # milliseconds of CPU at every server start.
    tls = httpx.create_ssl_context(trust_env=False)
    transport = httpx.HTTPTransport(verify=tls, trust_env=False)
    # httpx has no public way to give its connection pool a network backend: the pool it built is
    # replaced by one with the same (default) settings and ours.
    transport._pool = httpcore.ConnectionPool(
        ssl_context=tls,
        max_connections=100,  # httpx's default limits
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=GuardedBackend(targets),
    )
    return httpx.Client(transport=transport, trust_env=False)
