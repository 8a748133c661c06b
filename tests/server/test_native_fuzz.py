"""A fuzz of every native route: no input is a 500, every refusal is in the native error shape with a code
of hyperplan's error tree, and a refused request writes nothing.

The routes are read from the app itself, so a new native route is fuzzed without a change here; each
declares the body members and query parameters it takes (server/native.py, NativeRoute), and the fuzz
sends those most of the time, with values of every wrong kind, so the handlers' own checks are reached.
Each request is signed by an administrator and by an ordinary account. "Nothing written" is checked on
the store itself: every table of the SQLite file, read read-only, before and after.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperplan.client.signing import Credentials
from hyperplan.errors import HyperplanError
from hyperplan.runtime import Runtime
from hyperplan.server.app import create_app
from hyperplan.server.native import NativeRoute
from tests.harness import ADMIN, Server
from tests.server.native_raw import native_error, signed_native

EXAMPLES = 20  # per route and caller; with the fixed bodies below, the module runs in well under a minute
ADMIN_ONLY_EXAMPLES = 5  # an ordinary account is refused before anything is read


def native_routes() -> list[NativeRoute]:
    """Every native route the app serves. create_app only assembles routes and middleware; nothing runs
    until the app is served, so no runtime is needed to read them."""
    app = create_app(cast(Runtime, None))
    found = [route for route in app.routes if isinstance(route, NativeRoute)]
    plain = [r for r in app.routes if getattr(r, "path", "").startswith("/api/") and r not in found]
    assert not plain, f"native routes must be NativeRoutes (declaring what they take): {plain}"
    return found


ROUTES = native_routes()


def method_of(route: NativeRoute) -> str:
    methods = (route.methods or set()) - {"HEAD"}  # Starlette answers HEAD for every GET route
    assert len(methods) == 1, route
    return next(iter(methods))


def route_id(route: NativeRoute) -> str:
    return f"{method_of(route)} {route.path}"


def error_codes() -> set[str]:
    codes, pending = set(), [HyperplanError]
    while pending:
        kind = pending.pop()
        codes.add(kind.code)
        pending.extend(kind.__subclasses__())
    return codes - {"InternalFailure"}


ERROR_CODES = error_codes()
SIGNING_CODES = {
    "InvalidSignatureException",
    "UnrecognizedClientException",
    "MissingAuthenticationTokenException",
}


# -- the server and what it holds ----------------------------------------------------------------------


Store = dict[str, list[tuple[object, ...]]]


@dataclass
class Fuzzed:
    server: Server
    ordinary: Credentials
    known: list[str]  # names and ids that exist, so that handlers get past their lookups
    last_seen: Store | None = None  # the store after the previous request: the next one's "before"

    @property
    def database(self) -> Path:
        return self.server.data_dir / "hyperplan.db"

    def store(self) -> Store:
        """The store now, remembered as the state the next request starts from."""
        self.last_seen = store_contents(self.database)
        return self.last_seen


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    """One server for the module: an ordinary account with a plan whose invoice awaits approval, another
    account with a webhook and a spare key (the administrator's and the ordinary keys are never named,
    so the fuzz cannot lock itself out)."""
    server = Server(data_dir=tmp_path_factory.mktemp("fuzz") / "data").start()
    try:
        ordinary = server.new_account("fuzz-user", PaymentMode="approval")
        sagemaker = server.sagemaker(ordinary)
        offering = sagemaker.search_training_plan_offerings(
            InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
        )["TrainingPlanOfferings"][0]
        sagemaker.create_training_plan(
            TrainingPlanName="fuzz-plan", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )
        native = server.native()
        spare = native.post("/api/v1/accounts", {"Name": "fuzz-hooks"})
        spare_key = native.post("/api/v1/accounts/fuzz-hooks/keys")["AccessKeyId"]
        hook = native.post(
            "/api/v1/webhooks", {"Account": "fuzz-hooks", "Url": "https://hooks.example.invalid/fuzz"}
        )
        invoice = native.get("/api/v1/invoices")["Invoices"][0]["InvoiceId"]
        user_id = next(
            a["AccountId"] for a in native.get("/api/v1/accounts")["Accounts"] if a["Name"] == "fuzz-user"
        )
        known = [
            "admin", "fuzz-user", user_id, "fuzz-hooks", spare["AccountId"], "fuzz-plan", spare_key,
            str(invoice), str(hook["WebhookId"]), "algo-1", "stdout", "1:0", "Pending",
        ]  # fmt: skip
        yield Fuzzed(server, ordinary, known)
        assert "failed with a bug" not in server.log()
    finally:
        server.close()


def store_contents(database: Path) -> Store:
    """Every row of every table, read through a read-only connection."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        listed = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = [name for (name,) in listed]
        return {
            table: connection.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()
            for table in tables
        }


# -- what is sent --------------------------------------------------------------------------------------

EDGE_NUMBERS = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**23, 10**30, -(10**30)]
EDGE_TEXTS = [
    "", " ", "0", "-1", "-5", "1e999999", "NaN", "Infinity", "-Infinity", "1.001", "2500.00", "²", "١٢",
    str(2**63), str(10**23), "1d", "90m", "99999999999999d", "2026-12-24T11:30:00Z", "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+14:00", "auto", "budget", "approval", "http://", "\x00", "a\nb", "ﬀ", "🙂",
    "x" * 5000, "%00", "../..", "1:0", f"1:{2**63}", "algo-0", "stderr",
]  # fmt: skip

# Path values: no "/", which the router reads as a separator; everything else is percent-encoded.
texts = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="/"), min_size=1, max_size=80)
numbers = st.one_of(st.integers(), st.sampled_from(EDGE_NUMBERS))
strings = st.one_of(
    texts,
    st.sampled_from(EDGE_TEXTS),
    numbers.map(str),
    st.from_regex(r"[0-9]{1,30}(\.[0-9]{0,4})?", fullmatch=True),
)
scalars = st.one_of(
    st.none(), st.booleans(), numbers, st.floats(allow_nan=False, allow_infinity=False), strings
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(strings, inner, max_size=4)),
    max_leaves=8,
)

# Bodies that json.dumps does not write, sent as bytes.
RAW_BODIES = [
    b"[" * 5_000 + b"]" * 5_000,
    b'{"a":' * 2_000 + b"1" + b"}" * 2_000,
    b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}",
    b'{"x": [' + b"0," * 12_000 + b"0]}",
    b'{"x": NaN}',
    b'{"x": Infinity}',
    b'{"x": -Infinity}',
    b'{"x": ' + b"9" * 5_000 + b"}",
    b'{"x": 1e99999999999999999999}',
    b'{"x": "\\ud800"}',
    b'{"x": "\xff\xfe"}',
    b'{"x": ',
    b"[1, 2]",
    b'"text"',
    b"null",
    b"\x00\x01\x02",
    b"\xef\xbb\xbf{}",
]


def members_of(route: NativeRoute) -> st.SearchStrategy[str]:
    declared = list(route.body_members)
    others = st.one_of(st.sampled_from(["Name", "Quotas", "Budget", "Reason", "x"]), texts)
    return st.one_of(st.sampled_from(declared), others) if declared else others


def bodies(route: NativeRoute) -> st.SearchStrategy[bytes]:
    quotas = st.fixed_dictionaries(
        {}, optional={"MaxActivePlans": json_values, "MaxReservedInstancesPerType": json_values}
    )
    values = st.one_of(json_values, quotas, st.lists(strings, max_size=3))
    objects = st.dictionaries(members_of(route), values, max_size=4)
    return st.one_of(
        objects.map(lambda body: json.dumps(body).encode()),
        st.just(b""),
        st.sampled_from(RAW_BODIES),
        st.binary(max_size=64),
    )


def queries(route: NativeRoute, fuzz: Fuzzed) -> st.SearchStrategy[str]:
    keys = st.one_of(
        st.sampled_from(list(route.query_keys) or ["x"]), st.sampled_from(["account", "x", "limit"])
    )
    pairs = st.dictionaries(keys, st.one_of(st.sampled_from(fuzz.known), strings), max_size=3)
    return pairs.map(
        lambda found: "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in found.items())
    )


def path_values(fuzz: Fuzzed) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(fuzz.known), strings.filter(lambda text: text and "/" not in text))


def paths(route: NativeRoute, fuzz: Fuzzed) -> st.SearchStrategy[str]:
    names = list(route.param_convertors)
    values = st.fixed_dictionaries({name: path_values(fuzz) for name in names})
    # Dots too are encoded: a client would otherwise resolve "." and ".." segments away.
    return values.map(
        lambda found: route.path.format(
            **{name: quote(value, safe="").replace(".", "%2E") for name, value in found.items()}
        )
    )


# -- what must hold ------------------------------------------------------------------------------------


def check(fuzz: Fuzzed, route: NativeRoute, caller: Credentials, path: str, query: str, body: bytes) -> None:
    method = method_of(route)
    before = fuzz.last_seen or fuzz.store()
    target = f"{path}?{query}" if query else path
    response = signed_native(fuzz.server, method, target, body, credentials=caller)
    after = fuzz.store()
    sent = f"{method} {target[:300]} body={body[:300]!r}"
    assert response.status_code < 500, f"{sent}: {response.status_code} {response.text[:500]}"
    if response.status_code < 400:
        assert isinstance(response.json(), dict), sent
        assert method != "GET" or after == before, f"{sent}: a GET wrote"
        return
    error = native_error(response)
    assert error["Code"] in ERROR_CODES, (sent, error)
    assert error["Code"] not in SIGNING_CODES, (sent, error)  # signed correctly: the route itself refused
    assert isinstance(error["Message"], str) and error["Message"], (sent, error)
    if route.admin and caller is not ADMIN:
        assert error["Code"] == "AccessDeniedException", (sent, error)
    assert after == before, f"{sent}: refused with {error}, yet something was written"


CALLERS = ["administrator", "ordinary"]


@pytest.mark.parametrize("who", CALLERS)
@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_generated_requests_are_answered_without_a_500_and_refusals_write_nothing(
    fuzzed: Fuzzed, route: NativeRoute, who: str
) -> None:
    caller = ADMIN if who == "administrator" else fuzzed.ordinary
    examples = ADMIN_ONLY_EXAMPLES if route.admin and caller is not ADMIN else EXAMPLES

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(path=paths(route, fuzzed), query=queries(route, fuzzed), body=bodies(route))
    def fuzz(path: str, query: str, body: bytes) -> None:
        check(fuzzed, route, caller, path, query, body)

    fuzz()


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_bodies_json_dumps_never_writes_are_refused_on_every_route(
    fuzzed: Fuzzed, route: NativeRoute
) -> None:
    path = route.path.format(**{name: quote(fuzzed.known[0]) for name in route.param_convertors})
    before = fuzzed.store()
    for body in RAW_BODIES:
        response = signed_native(fuzzed.server, method_of(route), path, body)
        assert response.status_code == 400, (body[:80], response.text)
        assert native_error(response)["Code"] == "SerializationException", (body[:80], response.text)
    assert fuzzed.store() == before


def test_every_native_route_is_fuzzed() -> None:
    """The enumeration finds the routes the API documents (a sample), so the fuzz is not vacuous."""
    found = {route_id(route) for route in ROUTES}
    for expected in (
        "PATCH /api/v1/accounts/{account}",
        "GET /api/v1/accounts/{account}/ledger",
        "POST /api/v1/invoices/{invoice}/approve",
        "DELETE /api/v1/webhooks/{webhook}",
        "GET /api/v1/training-jobs/{name}/logs",
    ):
        assert expected in found
    assert len(found) == len(ROUTES) >= 22
