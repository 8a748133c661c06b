"""The pure parts of the connection caps (server/fair_connections.py, server/limits.py): whose address a
request is from, the counts per address, and the refusals' shapes; no server, no socket, no clock."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from hyperplan.errors import ServiceUnavailable, ValidationError
from hyperplan.server.fair_connections import AddressLedger, RefusalLog, TrustedProxies, forwarded_address
from hyperplan.server.header_deadline import refusal_at_opening, refusal_in_the_requests_shape
from hyperplan.server.limits import ServerLimits

PROXY = "10.0.0.2"
PROXIES = TrustedProxies.parse([PROXY])
CLIENT = "203.0.113.7"


# -- whose address ------------------------------------------------------------------------------------


def test_only_a_named_proxy_is_trusted() -> None:
    """(An untrusted peer's X-Forwarded-For is never read: tests/server/test_fair_connections.py.)"""
    assert PROXIES.trusts(PROXY) and not PROXIES.trusts("192.0.2.1")
    assert not TrustedProxies().trusts("127.0.0.1")  # none trusted by default


def test_a_trusted_proxys_client_is_the_right_most_address_it_does_not_trust() -> None:
    assert PROXIES.forwarded_client(PROXY, [CLIENT]) == CLIENT
    # The client wrote the first entry itself; the proxy appended the address it saw.
    assert PROXIES.forwarded_client(PROXY, [f"198.51.100.1, {CLIENT}"]) == CLIENT
    assert PROXIES.forwarded_client(PROXY, ["198.51.100.1", CLIENT]) == CLIENT  # the header twice: in order


def test_a_chain_of_trusted_proxies_is_walked_back_to_the_first_untrusted_address() -> None:
    proxies = TrustedProxies.parse(["10.0.0.0/8"])
    assert proxies.forwarded_client("10.0.0.6", [f"198.51.100.1, {CLIENT}, 10.0.0.5"]) == CLIENT
    # Every hop trusted: the request began at the left-most.
    assert proxies.forwarded_client("10.0.0.6", ["10.0.0.7, 10.0.0.5"]) == "10.0.0.7"


@pytest.mark.parametrize(
    "forwarded", [[], [""], ["unknown"], [f"{CLIENT}, unknown"], ["fe80::1%eth0"], ["client.example"]]
)
def test_a_trusted_proxy_naming_no_address_is_the_client_itself(forwarded: list[str]) -> None:
    assert PROXIES.forwarded_client(PROXY, forwarded) == PROXY


@pytest.mark.parametrize(
    ("hop", "address"),
    [
        ("203.0.113.7", "203.0.113.7"),
        (" 203.0.113.7:5000 ", "203.0.113.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("::ffff:203.0.113.7", "203.0.113.7"),  # one client, one count
        ("[2001:db8::1", None),
        ("203.0.113.7:5000:1", None),
        ("300.0.0.1", None),
    ],
)
def test_forwarded_entries_are_addresses_with_or_without_a_port(hop: str, address: str | None) -> None:
    parsed = forwarded_address(hop)
    assert (str(parsed) if parsed is not None else None) == address


def test_a_dual_stack_peer_is_trusted_by_its_ipv4_address() -> None:
    assert TrustedProxies.parse(["127.0.0.1"]).trusts("::ffff:127.0.0.1")
    assert not TrustedProxies.parse(["127.0.0.1"]).trusts("::1")


def test_the_scheme_is_a_trusted_proxys_word_alone() -> None:
    assert PROXIES.forwarded_scheme(["https"], "http") == "https"
    assert PROXIES.forwarded_scheme(["http, HTTPS"], "http") == "https"  # the last proxy's
    assert PROXIES.forwarded_scheme(["gopher"], "http") == "http"


def test_trusted_proxies_are_addresses_or_blocks_repeated_or_separated() -> None:
    proxies = TrustedProxies.parse(["127.0.0.1,10.0.0.0/8", "  192.0.2.0/24 2001:db8::/32"])
    assert [str(network) for network in proxies.networks] == [
        "127.0.0.1/32",
        "10.0.0.0/8",
        "192.0.2.0/24",
        "2001:db8::/32",
    ]
    assert proxies.trusts("10.1.2.3") and proxies.trusts("2001:db8::9") and not proxies.trusts("192.0.3.1")
    assert not TrustedProxies.parse([]) and not TrustedProxies.parse([" , "])


@pytest.mark.parametrize("value", ["proxy.example", "10.0.0.1/8", "10.0.0.0/33"])
def test_a_trusted_proxy_that_is_no_address_or_block_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValidationError, match="--trusted-proxy") as refused:
        TrustedProxies.parse([f"127.0.0.1,{value}"])
    assert repr(value) in refused.value.message


# -- the counts ---------------------------------------------------------------------------------------


def test_an_address_waits_for_headers_on_at_most_its_pending_share() -> None:
    ledger = AddressLedger(max_open=4, max_pending=2)
    seats = [ledger.admit("192.0.2.1"), ledger.admit("192.0.2.1")]
    with pytest.raises(ServiceUnavailable, match="2 connections that have sent no request's headers"):
        ledger.admit("192.0.2.1")
    ledger.admit("192.0.2.2")  # another address has its own share
    ledger.wait_for_headers(seats[0], False)  # its headers are in
    ledger.admit("192.0.2.1")
    assert ledger.open_count("192.0.2.1") == 3 and ledger.pending_count("192.0.2.1") == 2


def test_an_address_holds_at_most_its_open_share_waiting_or_not() -> None:
    ledger = AddressLedger(max_open=3, max_pending=3)
    seats = [ledger.admit("192.0.2.1") for _ in range(3)]
    for seat in seats:
        ledger.wait_for_headers(seat, False)
    with pytest.raises(ServiceUnavailable, match="3 open connections"):
        ledger.admit("192.0.2.1")
    ledger.release(seats[0])
    ledger.admit("192.0.2.1")


def test_a_closed_connection_leaves_nothing_behind() -> None:
    ledger = AddressLedger(max_open=3, max_pending=2)
    seats = [ledger.admit(f"192.0.2.{n}") for n in range(1, 4)]
    ledger.wait_for_headers(seats[0], False)
    ledger.wait_for_headers(seats[0], False)  # twice is once
    ledger.wait_for_headers(seats[1], True)
    for seat in seats:
        ledger.release(seat)
        ledger.release(seat)  # twice is once
    assert len(ledger) == 0  # the ledger is as large as the connections open


def test_a_proxys_connection_counts_for_the_client_whose_request_it_carries() -> None:
    ledger = AddressLedger(max_open=2, max_pending=1)
    seats = [AddressLedger.proxied() for _ in range(4)]  # the proxy itself is never refused
    for seat in seats:
        ledger.wait_for_headers(seat, True)  # nor counted waiting for headers
    assert ledger.pending_count(PROXY) == 0
    ledger.carry(seats[0], CLIENT)
    ledger.carry(seats[1], CLIENT)
    with pytest.raises(ServiceUnavailable, match=f"{CLIENT} already holds 2 open connections"):
        ledger.carry(seats[2], CLIENT)
    assert seats[2].address is None
    ledger.carry(seats[2], "198.51.100.1")  # another client behind the same proxy
    ledger.carry(seats[0], None)  # its response sent: the connection is nobody's
    ledger.carry(seats[3], CLIENT)
    ledger.carry(seats[3], CLIENT)  # the same client's next request on it: already counted
    assert ledger.open_count(CLIENT) == 2 and ledger.open_count("198.51.100.1") == 1
    for seat in seats:
        ledger.release(seat)
    assert len(ledger) == 0


# -- the settings -------------------------------------------------------------------------------------


def test_the_shares_default_to_parts_of_the_servers_cap() -> None:
    assert (ServerLimits().connections_per_address, ServerLimits().pending_per_address) == (32, 16)
    small = ServerLimits(max_connections=4)
    assert (small.connections_per_address, small.pending_per_address) == (1, 1)
    given = ServerLimits(max_connections_per_address=10)
    assert (given.connections_per_address, given.pending_per_address) == (10, 5)
    for limits in (ServerLimits(), small, given, ServerLimits(max_connections=2)):
        limits.check()


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        (ServerLimits(max_connections=8, max_connections_per_address=8), "--max-connections-per-address"),
        (ServerLimits(max_connections_per_address=4, max_pending_per_address=5), "--max-pending-per-address"),
    ],
)
def test_shares_one_address_could_fill_the_server_with_are_refused(limits: ServerLimits, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        limits.check()


# -- the refusals -------------------------------------------------------------------------------------


def test_refusals_are_logged_at_most_once_a_minute_with_their_count(caplog: pytest.LogCaptureFixture) -> None:
    notes = RefusalLog()
    with caplog.at_level(logging.WARNING, logger="hyperplan.server.fair_connections"):
        notes.note(1000.0, "first")
        notes.note(1001.0, "second")
        notes.note(1059.0, "third")
        notes.note(1061.0, "fourth")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("refused 1 ") and lines[0].endswith("the last: first")
    assert lines[1].startswith("refused 3 ") and lines[1].endswith("the last: fourth")


def test_a_connection_refused_as_it_opens_is_answered_in_both_json_shapes_and_closed() -> None:
    message = refusal_at_opening(ServiceUnavailable("full"), [(b"server", b"uvicorn")])
    head, _, body = message.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    assert headers["x-amzn-errortype"] == "serviceunavailable" and headers["connection"] == "close"
    assert headers["content-type"] == "application/x-amz-json-1.1" and headers["server"] == "uvicorn"
    assert int(headers["content-length"]) == len(body)
    said = json.loads(body)
    assert said["__type"] == "ServiceUnavailable" and said["message"] == "full"  # botocore's JSON parser
    assert said["Error"] == {"Code": "ServiceUnavailable", "Message": "full"}  # the native API's
    assert said["RequestId"] == headers["x-amzn-requestid"]


def _scope(method: str, path: str, headers: dict[str, str], query: str = "") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
    }


AWS_JSON = b'"__type":"ServiceUnavailable"'


def _signed_for(service: str) -> dict[str, str]:
    return {"authorization": f"AWS4-HMAC-SHA256 Credential=AKID/20261231/us-west-2/{service}/aws4_request, x"}


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (_scope("POST", "/", {"x-amz-target": "SageMaker.ListTrainingPlans"}), AWS_JSON),
        (_scope("POST", "/", _signed_for("logs")), AWS_JSON),
        (_scope("GET", "/api/v1/accounts", _signed_for("sagemaker")), b'"Code":"ServiceUnavailable"'),
        (_scope("GET", "/bucket/key", _signed_for("s3")), b"<Code>ServiceUnavailable</Code>"),
        (_scope("GET", "/bucket", {}), b"<Code>ServiceUnavailable</Code>"),  # unsigned, S3's by its looks
        (_scope("POST", "/", _signed_for("sts")), b"<Type>Receiver</Type><Code>ServiceUnavailable</Code>"),
    ],
)
def test_a_request_refused_once_its_headers_are_in_is_answered_in_its_apis_shape(
    scope: dict[str, Any], expected: bytes
) -> None:
    response = refusal_in_the_requests_shape(scope, ServiceUnavailable("full"))
    assert response.status_code == 503 and expected in response.body
    assert response.headers["connection"] == "close"
