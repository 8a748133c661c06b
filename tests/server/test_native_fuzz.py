"""A fuzz of every native route: no input is a 500, every refusal is in the native error shape with a code
of hyperplan's error tree, and a refused request writes nothing.

The routes are read from the app itself, so a new native route is fuzzed without a change here; each
declares the body members and query parameters it takes (server/native.py, NativeRoute), and the fuzz
sends those most of the time, with values of every wrong kind, so the handlers' own checks are reached.
Each request is signed by an administrator and by an ordinary account. "Nothing written" is checked on
the store itself, read-only: SQLite's data_version, and every table whenever that moves. A sweep puts one
bad value among good new ones in every member of every route's example, so that a handler that stores
part of a request before refusing the rest is caught too.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperplan.errors import HyperplanError
from hyperplan.server.app import create_app
from hyperplan.server.native import NativeRoute
from hyperplan.signing import Credentials
from tests.harness import ADMIN, Server
from tests.server.native_raw import native_error, signed_native

EXAMPLES = 15  # per route and caller: with the sweep and the fixed bodies, ~1100 requests in all
ADMIN_ONLY_EXAMPLES = 5  # an ordinary account is refused before anything is read


def native_routes() -> list[NativeRoute]:
    """Every native route the app serves. create_app only assembles routes and middleware; nothing runs
    until the app is served, so no runtime is needed to read them."""
    app = create_app(cast(Any, None))  # the service context is only read by a request
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
    return f"{method_of(route)} {route.path_format}"  # {plan:path} said {plan}


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


Contents = dict[str, list[tuple[object, ...]]]


# Tables a server writes whatever a request asks: each process renews its presence in `leases` every few
# seconds, by itself; `rate_buckets` is the accounts' shared rate limits, from which a process takes a
# batch of tokens before it reads a request (throttling counts refused requests and reads too).
BOOKKEEPING = frozenset({"leases", "rate_buckets"})


class Store:
    """The server's SQLite file, read through one read-only connection. `PRAGMA data_version` moves
    whenever another connection commits, so an unmoved version proves nothing was written; when it
    moves, every table is read and compared, so a commit that changed nothing is not taken for a write."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self.version = self._version()
        self.contents = self._contents()

    def changes(self) -> list[str]:
        """The tables that changed since the previous call."""
        version = self._version()
        if version == self.version:
            return []
        before, self.version, self.contents = self.contents, version, self._contents()
        return [
            table
            for table in sorted(set(before) | set(self.contents))
            if before.get(table) != self.contents.get(table)
        ]

    def close(self) -> None:
        self.connection.close()

    def _version(self) -> int:
        return int(self.connection.execute("PRAGMA data_version").fetchone()[0])

    def _contents(self) -> Contents:
        listed = self.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {
            table: self.connection.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()
            for (table,) in listed
            if table not in BOOKKEEPING
        }


@dataclass(frozen=True)
class Example:
    """A request a route takes (or refuses only for what the store holds): the fuzz varies it, so that
    most requests get past the first check and reach the ones behind it."""

    path: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fuzzed:
    server: Server
    ordinary: Credentials
    known: list[str]  # names and ids that exist, so that handlers get past their lookups
    ids: tuple[str, str, str]  # an invoice, a webhook and a spare access key
    store: Store

    def example(self, route: NativeRoute, n: int) -> Example:
        """The route's example with its values made from `n` (a route without one is fuzzed too)."""
        return examples(*self.ids, n).get(route_id(route), Example())


def examples(invoice: str, webhook: str, spare_key: str, n: int) -> dict[str, Example]:
    """One example per route (a new route needs one: test_every_route_has_an_example). The values that
    are stored are made from `n`, so that a refused request that wrote part of them would be seen."""
    user, hooks = {"account": "fuzz-user"}, {"account": "fuzz-hooks"}
    account_update = {
        "PaymentMode": ("auto", "budget", "approval")[n % 3],
        "Budget": f"{n % 100_000}.{n % 100:02d}",
        "AddBudget": f"0.{n // 7 % 100:02d}",
        "Quotas": {"MaxActivePlans": 1 + n % 999, "MaxReservedInstancesPerType": 1 + n // 3 % 999},
        "ReclaimWarningHours": [1 + n % 168, 1 + n // 5 % 168],
    }
    new_account = {"Name": f"fuzz-new-{n}", "Admin": n % 2 == 0, "PaymentMode": "budget"}
    return {
        "GET /api/v1/whoami": Example(),
        "GET /api/v1/accounts": Example(),
        "POST /api/v1/accounts": Example(body=new_account),
        "POST /api/v1/accounts/{account}/keys": Example(hooks),
        "DELETE /api/v1/accounts/{account}": Example({"account": "admin"}),  # the caller itself: refused
        "DELETE /api/v1/keys/{key}": Example({"key": spare_key}),
        "POST /api/v1/master-key/rotate": Example(),
        "GET /api/v1/clock": Example(),
        "POST /api/v1/clock/advance": Example(body={"Duration": "1h"}),
        # A day past where test servers start (tests/harness.py): a short move, so few events run.
        "POST /api/v1/clock/set": Example(body={"Time": "2027-01-01T23:50:00Z"}),
        "GET /api/v1/fleet": Example(query={"days": "7"}),
        "PATCH /api/v1/accounts/{account}": Example(hooks, body=account_update),
        "GET /api/v1/accounts/{account}/ledger": Example(user),
        "GET /api/v1/invoices": Example(query={**user, "status": "Pending"}),
        "POST /api/v1/invoices/{invoice}/approve": Example({"invoice": invoice}),
        "POST /api/v1/invoices/{invoice}/reject": Example({"invoice": invoice}, body={"Reason": f"fuzz {n}"}),
        "GET /api/v1/plans/{name}/events": Example({"name": "fuzz-plan"}, query=user),
        "POST /api/v1/clusters/{cluster}/nodes/{node}/exec": Example(
            {"cluster": "fuzz-cluster", "node": "i-0"}, body={"Command": ["true"], "TimeoutSeconds": 5}
        ),
        "GET /api/v1/training-jobs/{name}": Example({"name": "fuzz-job"}),
        "PUT /api/v1/training-plans/{plan}/extension-policy": Example(
            {"plan": "fuzz-plan"}, body={"MaxDays": 1 + n % 182, "MaxPrice": f"{1 + n % 9999}.{n % 100:02d}"}
        ),
        "GET /api/v1/training-plans/{plan}/extension-policy": Example({"plan": "fuzz-plan"}),
        "DELETE /api/v1/training-plans/{plan}/extension-policy": Example({"plan": "fuzz-plan"}),
        "PUT /api/v1/training-plans/{plan}/lending": Example(
            {"plan": "fuzz-plan"}, body={"Notice": 1 + n % 600, "MinRun": n % 3600, "StopMargin": n % 7200}
        ),
        "GET /api/v1/training-plans/{plan}/lending": Example({"plan": "fuzz-plan"}),
        "DELETE /api/v1/training-plans/{plan}/lending": Example({"plan": "fuzz-plan"}),
        "POST /api/v1/training-plans/{plan}/return-quotes": Example(
            {"plan": "fuzz-plan"}, body={"Segment": 1, "Instances": 1 + n % 4}
        ),
        "POST /api/v1/return-quotes/{quote}/return": Example({"quote": f"rq-{n:032x}"}),
        "GET /api/v1/training-plans/{plan}": Example({"plan": "fuzz-plan"}),
        "GET /api/v1/cancellation-policies": Example(),
        "GET /api/v1/training-jobs/{name}/plans": Example({"name": "fuzz-job"}),
        "PUT /api/v1/training-jobs/{name}/plans/{plan}": Example({"name": "fuzz-job", "plan": "fuzz-plan"}),
        "DELETE /api/v1/training-jobs/{name}/plans/{plan}": Example(
            {"name": "fuzz-job", "plan": "fuzz-plan"}
        ),
        "GET /api/v1/clusters/{cluster}/instance-groups/{group}/plans": Example(
            {"cluster": "fuzz-cluster", "group": "workers"}
        ),
        "PUT /api/v1/clusters/{cluster}/instance-groups/{group}/plans/{plan}": Example(
            {"cluster": "fuzz-cluster", "group": "workers", "plan": "fuzz-plan"}
        ),
        "DELETE /api/v1/clusters/{cluster}/instance-groups/{group}/plans/{plan}": Example(
            {"cluster": "fuzz-cluster", "group": "workers", "plan": "fuzz-plan"}
        ),
        "GET /api/v1/training-jobs/{name}/logs": Example(
            {"name": "fuzz-job"}, query={"host": "algo-1", "stream": "stdout", "cursor": "1:0"}
        ),
        "POST /api/v1/accounts/{account}/plans/{name}/cancel": Example(
            {**user, "name": "fuzz-plan"}, body={"Reason": f"fuzz {n}"}
        ),
        "POST /api/v1/webhooks": Example(
            body={"Account": "fuzz-hooks", "Url": f"https://hooks.example.invalid/{n}"}
        ),
        "GET /api/v1/webhooks": Example(query=hooks),
        "DELETE /api/v1/webhooks/{webhook}": Example({"webhook": webhook}),
        "GET /api/v1/webhooks/{webhook}/deliveries": Example({"webhook": webhook}, query={"limit": "10"}),
        "GET /api/v1/buckets": Example(),
        "POST /api/v1/buckets": Example(body={"Name": f"fuzz-bucket-{n}"}),
        "POST /api/v1/buckets/{bucket}/grants": Example(
            {"bucket": "fuzz-bucket"}, body={"Account": "fuzz-user", "ReadOnly": n % 2 == 0}
        ),
        "DELETE /api/v1/buckets/{bucket}/grants/{account}": Example({"bucket": "fuzz-bucket", **user}),
        "GET /api/v1/users": Example(query=user),
        "POST /api/v1/users": Example(
            body={"UserName": f"fuzz-person-{n}", "Owner": n % 2 == 0, "Account": "fuzz-user"}
        ),
        "DELETE /api/v1/users/{user}": Example({"user": "fuzz-colleague"}, query=user),
        "GET /api/v1/keys": Example(query={"user": "fuzz-colleague", **user}),
        "POST /api/v1/keys": Example(body={"UserName": "fuzz-colleague", "Account": "fuzz-user"}),
        "POST /api/v1/keys/{key}/activate": Example({"key": spare_key}),
        "POST /api/v1/keys/{key}/deactivate": Example({"key": spare_key}),
        "GET /api/v1/registries": Example(),
        "POST /api/v1/registries/{host}/credentials": Example(
            {"host": "registry.example.com:5000"},
            body={"Username": f"fuzz-{n}", "Password": f"fuzz-password-{n}"},
        ),
        "DELETE /api/v1/registries/{host}/credentials": Example({"host": "registry.example.com:5000"}),
        "POST /api/v1/training-plan-offerings/search": Example(
            body={
                "InstanceTypes": [
                    {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1 + n % 2},
                    {"InstanceType": "ml.p4d.24xlarge"},
                ],
                "InstanceCount": 1,
                "DurationHours": 24 * (1 + n % 3),
                "TargetResources": ["training-job"],
                "StartTimeAfter": "2027-01-02T11:30:00Z",
                "EndTimeBefore": 1_800_000_000,  # epoch seconds: 2027-01-15T08:00:00Z
            }
        ),
        "POST /api/v1/training-jobs": Example(
            body={
                "TrainingJob": {
                    "TrainingJobName": f"fuzz-auto-{n}",
                    "RoleArn": "arn:aws:iam::123456789012:role/FuzzRole",
                    "AlgorithmSpecification": {
                        "TrainingInputMode": "File",
                        "ContainerEntrypoint": ["python", "-c", "pass"],
                    },
                    "OutputDataConfig": {"S3OutputPath": "s3://fuzz-bucket/output"},
                    "ResourceConfig": {
                        "InstanceType": "ml.p5.48xlarge",
                        "InstanceCount": 1,
                        "VolumeSizeInGB": 1,
                    },
                    "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxPendingTimeInSeconds": 7200},
                },
                "AutoBook": {
                    "InstanceTypes": [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1 + n % 2}],
                    "DurationHours": 24 * (1 + n % 3),
                    "Within": "14d",
                    "MaxPrice": f"{n % 10_000}.{n % 100:02d}",  # mostly below any offering: it waits
                    "Prefer": ("cheapest", "earliest")[n % 2],
                },
            }
        ),
        "GET /api/v1/audit": Example(query={"since": "2026-12-01T00:00:00Z", **user}),
        "GET /api/v1/drain": Example(),
        "POST /api/v1/drain": Example(body={"StopRunning": n % 2 == 0}),
        "POST /api/v1/resume": Example(),
        "GET /api/v1/usage": Example(
            query={**user, "from": "2026-12-01T00:00:00Z", "to": "2027-01-01T00:00:00Z", "tag": "team"}
        ),
        "GET /api/v1/usage/monthly": Example(
            query={**user, "from": "2026-12-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"}
        ),
    }


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
        native.post("/api/v1/users", {"UserName": "fuzz-colleague", "Account": "fuzz-user"})
        hook = native.post(
            "/api/v1/webhooks", {"Account": "fuzz-hooks", "Url": "https://hooks.example.invalid/fuzz"}
        )
        invoice = native.get("/api/v1/invoices")["Invoices"][0]["InvoiceId"]
        native.post("/api/v1/buckets", {"Name": "fuzz-bucket"})
        user_id = next(
            a["AccountId"] for a in native.get("/api/v1/accounts")["Accounts"] if a["Name"] == "fuzz-user"
        )
        known = [
            "admin", "fuzz-user", user_id, "fuzz-hooks", spare["AccountId"], "fuzz-plan", spare_key,
            "fuzz-colleague", str(invoice), str(hook["WebhookId"]), "algo-1", "stdout", "1:0", "Pending",
            "fuzz-bucket", "*",
        ]  # fmt: skip
        store = Store(server.data_dir / "hyperplan.db")
        try:
            yield Fuzzed(server, ordinary, known, (str(invoice), str(hook["WebhookId"]), spare_key), store)
        finally:
            store.close()
        assert "failed with a bug" not in server.log()
    finally:
        server.close()


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
    max_leaves=6,
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


class _Drop:
    """A member left out of a variant."""


DROP = _Drop()


def variant(value: Any, leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`value`, or `value` with members kept, varied in turn, replaced by `leaves` or dropped, and now
    and then one it does not have."""
    if isinstance(value, dict):
        members = {
            key: st.one_of(st.just(item), variant(item, leaves), leaves, st.just(DROP))
            for key, item in value.items()
        }
        extra = st.one_of(st.just({}), st.just({}), st.dictionaries(texts, leaves, min_size=1, max_size=1))
        return st.builds(
            lambda kept, more: {k: v for k, v in {**kept, **more}.items() if v is not DROP},
            st.fixed_dictionaries(members),
            extra,
        )
    if isinstance(value, list):
        return st.one_of(st.just(value), st.lists(st.one_of(st.sampled_from(value), leaves), max_size=4))
    return st.one_of(st.just(value), leaves)


def members_of(route: NativeRoute) -> st.SearchStrategy[str]:
    declared = list(route.body_members)
    others = st.one_of(st.sampled_from(["Name", "Quotas", "Budget", "Reason", "x"]), texts)
    return st.one_of(st.sampled_from(declared), others) if declared else others


def bodies(route: NativeRoute, example: Example) -> st.SearchStrategy[bytes]:
    """Mostly the example varied; otherwise members of the route's with any values, or raw bytes."""
    varied = variant(example.body, json_values).map(lambda body: json.dumps(body).encode())
    objects = st.dictionaries(members_of(route), json_values, max_size=4)
    anything = st.one_of(
        objects.map(lambda body: json.dumps(body).encode()),
        st.just(b""),
        st.sampled_from(RAW_BODIES),
        st.binary(max_size=64),
    )
    return st.one_of(varied, varied, anything)


def queries(route: NativeRoute, example: Example, fuzz: Fuzzed) -> st.SearchStrategy[str]:
    values = st.one_of(st.sampled_from(fuzz.known), strings)
    keys = st.one_of(
        st.sampled_from(list(route.query_keys) or ["x"]), st.sampled_from(["account", "x", "limit"])
    )
    pairs = st.one_of(variant(example.query, values), st.dictionaries(keys, values, max_size=3))
    return pairs.map(
        lambda found: "&".join(f"{quote(k, safe='')}={quote(str(v), safe='')}" for k, v in found.items())
    )


def path_values(fuzz: Fuzzed) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(fuzz.known), strings.filter(lambda text: text and "/" not in text))


# A fuzzed DELETE of an account could succeed (the module's accounts may have nothing open once another
# route's fuzz rejected an invoice), and would lock the ordinary caller out of every later route: it gets
# the caller itself (refused), the example, and names that exist nowhere. Its success is tested elsewhere.
NEVER_DELETED = ("DELETE", "/api/v1/accounts/{account}")
# So could a DELETE of a user, once a fuzzed request made another owner with a key: the callers' own
# users ("admin", "fuzz-user") are never named, only the example and names that exist nowhere.
CALLERS_NEVER_DELETED = ("DELETE", "/api/v1/users/{user}")


def paths(route: NativeRoute, example: Example, fuzz: Fuzzed) -> st.SearchStrategy[str]:
    deleting = (next(iter(route.methods or ())), route.path)
    names = strings.filter(
        lambda text: text and "/" not in text and not text.startswith("fuzz") and text != "admin"
    )
    if deleting == NEVER_DELETED:
        anything = st.one_of(st.just("admin"), names)
    elif deleting == CALLERS_NEVER_DELETED:
        anything = names
    else:
        anything = path_values(fuzz)
    values = st.fixed_dictionaries(
        {name: st.one_of(st.just(example.path.get(name, "x")), anything) for name in route.param_convertors}
    )
    # Dots too are encoded: a client would otherwise resolve "." and ".." segments away.
    return values.map(
        lambda found: route.path_format.format(
            **{name: quote(value, safe="").replace(".", "%2E") for name, value in found.items()}
        )
    )


# -- what must hold ------------------------------------------------------------------------------------


def check(fuzz: Fuzzed, route: NativeRoute, caller: Credentials, path: str, query: str, body: bytes) -> None:
    method = method_of(route)
    fuzz.store.changes()  # whatever an earlier request wrote is the state this one starts from
    target = f"{path}?{query}" if query else path
    response = signed_native(fuzz.server, method, target, body, credentials=caller)
    changed = fuzz.store.changes()
    sent = f"{method} {target[:300]} body={body[:300]!r}"
    assert response.status_code < 500, f"{sent}: {response.status_code} {response.text[:500]}"
    if response.status_code < 400:
        assert isinstance(response.json(), dict), sent
        assert method != "GET" or not changed, f"{sent}: a GET wrote to {changed}"
        return
    error = native_error(response)
    assert error["Code"] in ERROR_CODES, (sent, error)
    assert error["Code"] not in SIGNING_CODES, (sent, error)  # signed correctly: the route itself refused
    assert isinstance(error["Message"], str) and error["Message"], (sent, error)
    if route.admin and caller is not ADMIN:
        assert error["Code"] == "AccessDeniedException", (sent, error)
    assert not changed, f"{sent}: refused with {error}, yet {changed} changed"


CALLERS = ["administrator", "ordinary"]


@pytest.mark.parametrize("who", CALLERS)
@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_generated_requests_are_answered_without_a_500_and_refusals_write_nothing(
    fuzzed: Fuzzed, route: NativeRoute, who: str
) -> None:
    caller = ADMIN if who == "administrator" else fuzzed.ordinary
    count = ADMIN_ONLY_EXAMPLES if route.admin and caller is not ADMIN else EXAMPLES
    example = fuzzed.example(route, 0)  # the strategies are built once; the sweep below varies n

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        path=paths(route, example, fuzzed), query=queries(route, example, fuzzed), body=bodies(route, example)
    )
    def fuzz(path: str, query: str, body: bytes) -> None:
        check(fuzzed, route, caller, path, query, body)

    fuzz()


BAD_LEAVES: list[Any] = [None, "", "x" * 2000, -1, 10**30, 1.5, True, {}, [], "1e999999", "-5", "\x00"]


def leaf_locations(value: Any, location: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every member of a body, nested ones too (and the objects and lists that hold them)."""
    found = [location] if location else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        found += leaf_locations(item, (*location, key))
    return found


def replaced(body: dict[str, Any], location: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    parent: Any = changed
    for key in location[:-1]:
        parent = parent[key]
    parent[location[-1]] = value
    return changed


@pytest.mark.parametrize("route", [r for r in ROUTES if r.body_members], ids=route_id)
def test_one_bad_member_among_good_ones_is_refused_before_anything_is_written(
    fuzzed: Fuzzed, route: NativeRoute
) -> None:
    """The example's other members are valid and new (made from a fresh n), so a handler that stored
    them before it refused the bad one would be seen."""
    n = 0
    for location in leaf_locations(fuzzed.example(route, 0).body):
        for bad in BAD_LEAVES:
            n += 1
            example = fuzzed.example(route, 1000 + n)
            path = route.path_format.format(**{k: quote(v, safe="") for k, v in example.path.items()})
            body = json.dumps(replaced(example.body, location, bad)).encode()
            check(fuzzed, route, ADMIN, path, "", body)


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_bodies_json_dumps_never_writes_are_refused_on_every_route(
    fuzzed: Fuzzed, route: NativeRoute
) -> None:
    path = route.path_format.format(**{name: quote(fuzzed.known[0]) for name in route.param_convertors})
    fuzzed.store.changes()
    for body in RAW_BODIES:
        response = signed_native(fuzzed.server, method_of(route), path, body)
        assert response.status_code == 400, (body[:80], response.text)
        assert native_error(response)["Code"] == "SerializationException", (body[:80], response.text)
    assert fuzzed.store.changes() == []


def test_every_route_has_an_example(fuzzed: Fuzzed) -> None:
    assert sorted(examples(*fuzzed.ids, 0)) == sorted(route_id(route) for route in ROUTES)


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
