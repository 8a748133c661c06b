"""The console's rules, over HTTP against an in-process server: who sees what, CSRF, sessions, refusals.

Every console route is tried as another account, with the first account's plan, cluster, job, invoice
and account in its path (and its offering and plan in its form): each answer is a refusal (404, or 403
for administrators' routes), nothing of the first account's shows, and nothing changes. Every form
without a valid CSRF token is refused. A session ends with its key, and at sign-out; bad input is shown
next to its field; a throttled action says so.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from hyperplan.console.app import routes
from hyperplan.console.web import ConsoleRoute
from hyperplan.signing import Credentials
from tests.harness import ADMIN, service_now
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"
M5 = "ml.m5.12xlarge"
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class Console:
    """A browser's part, by hand: cookies, the CSRF token of the last page, forms posted."""

    def __init__(self, server: InProcessServer) -> None:
        self.http = httpx.Client(base_url=server.url, follow_redirects=False, timeout=60)
        self.token = ""

    def get(self, path: str) -> httpx.Response:
        response = self.http.get(path)
        found = CSRF.search(response.text)
        self.token = found.group(1) if found else self.token
        return response

    def post(self, path: str, data: dict[str, Any], *, token: str | None = None) -> httpx.Response:
        fields = {**data, "csrf_token": self.token if token is None else token}
        return self.http.post(path, data={k: v for k, v in fields.items() if v is not None})

    def sign_in(self, credentials: Credentials) -> httpx.Response:
        self.get("/console/sign-in")
        return self.post(
            "/console/sign-in",
            {"access_key_id": credentials.access_key, "secret_access_key": credentials.secret_key},
        )


@dataclass
class Alpha:
    """The account whose resources another tries to reach."""

    credentials: Credentials
    account_id: str
    plan_arn: str
    offering_id: str
    invoice_id: int

    names = ("alpha-plan", "alpha-cluster", "alpha-job")


def _group(name: str, count: int, instance_type: str = M5, plan: str | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {
        "InstanceGroupName": name,
        "InstanceType": instance_type,
        "InstanceCount": count,
        "LifeCycleConfig": {"SourceS3Uri": "s3://alpha-lifecycle/src", "OnCreate": "on_create.sh"},
        "ExecutionRole": ROLE,
    }
    if plan:
        group["TrainingPlanArn"] = plan
    return group


def _search(client: Any, count: int = 1, days: int = 1) -> str:
    offerings = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=24 * days, TargetResources=["hyperpod-cluster"]
    )["TrainingPlanOfferings"]
    return str(offerings[0]["TrainingPlanOfferingId"])


@pytest.fixture(scope="module")
def alpha(fast_shared_server: InProcessServer) -> Alpha:
    server = fast_shared_server
    credentials = server.new_account("alpha", PaymentMode="approval")
    client = server.sagemaker(credentials)
    plan_arn = client.create_training_plan(
        TrainingPlanName="alpha-plan", TrainingPlanOfferingId=_search(client)
    )["TrainingPlanArn"]
    client.create_cluster(ClusterName="alpha-cluster", InstanceGroups=[_group("controller", 1)])
    client.create_training_job(
        TrainingJobName="alpha-job",
        RoleArn=ROLE,
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo:1",
            "ContainerEntrypoint": ["python", "-c"],
            "ContainerArguments": ["print('alpha secret output')"],
        },
        OutputDataConfig={"S3OutputPath": "s3://alpha-output/out"},
        ResourceConfig={"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    invoices = server.native().get("/api/v1/invoices?account=alpha")["Invoices"]
    account_id = server.native(credentials).get("/api/v1/whoami")["AccountId"]
    return Alpha(credentials, account_id, plan_arn, _search(client), invoices[0]["InvoiceId"])


@pytest.fixture
def beta(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Iterator[Console]:
    """Another account, signed in to the console (each test its own account)."""
    name = "beta-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    credentials = fast_shared_server.new_account(name)
    console = Console(fast_shared_server)
    assert console.sign_in(credentials).status_code == 303
    yield console
    console.http.close()


def _console_routes() -> list[ConsoleRoute]:
    return [r for r in routes() if isinstance(r, ConsoleRoute)]


def _fill(path: str, values: dict[str, str]) -> str:
    """A route's path with its parameters given."""
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: values.get(m.group(1), "alpha"), path)


def _alpha_state(server: InProcessServer) -> Any:
    """What another account must not be able to change."""
    native = server.native()
    client = server.sagemaker()
    accounts = {a["Name"]: a for a in native.get("/api/v1/accounts")["Accounts"]}
    return (
        [(i["InvoiceId"], i["Status"]) for i in native.get("/api/v1/invoices?account=alpha")["Invoices"]],
        accounts["alpha"]["PaymentMode"],
        accounts["alpha"]["Budget"],
        len(native.get("/api/v1/invoices")["Invoices"]),
        client.list_clusters()["ClusterSummaries"],
    )


def test_every_console_route_refuses_another_accounts_resources(
    fast_shared_server: InProcessServer, alpha: Alpha, beta: Console
) -> None:
    server = fast_shared_server
    before = _alpha_state(server)
    plans_before = server.sagemaker(alpha.credentials).list_training_plans()["TrainingPlanSummaries"]
    form = {
        "offering_id": alpha.offering_id,
        "plan_name": "taken-over",
        "extension_days": "1",
        "cluster_name": "beta-cluster",
        "group_1_name": "worker",
        "group_1_type": P5,
        "group_1_count": "1",
        "group_1_capacity": alpha.plan_arn,
        "payment_mode": "auto",
        "budget": "5",
        "reason": "mine now",
    }
    params = {"invoice": str(alpha.invoice_id), "account": "alpha", "rest": "alpha-plan"}
    tried = 0
    for route in _console_routes():
        if route.public:
            continue
        prefix = route.path.split("/")[2] if route.path.count("/") > 1 else ""
        names = {"plans": "alpha-plan", "clusters": "alpha-cluster", "training-jobs": "alpha-job"}
        values = {**params, "name": names.get(prefix, "alpha-plan")}
        path = _fill(route.path, values)
        method = next(iter(route.methods - {"HEAD"}))
        response = beta.get(path) if method == "GET" else beta.post(path, form)
        tried += 1
        has_ids = "{" in route.path
        if has_ids or route.admin:
            assert response.status_code in (403, 404), (method, path, response.status_code)
        elif method == "POST" and path == "/console/new-cluster":  # alpha's plan as a group's capacity
            assert response.status_code == 400 and "has no training plan" in response.text, response.text
        elif path in ("/console/offerings/review", "/console/offerings/purchase"):  # alpha's offering id
            assert response.status_code == 404 and "does not exist or has expired" in response.text
        else:  # the caller's own lists and searches (a search without its fields is refused)
            assert response.status_code in (200, 303, 400), (method, path, response.status_code)
        # A refusal may echo the name the caller typed (as the API's does), never anything of alpha's.
        shown = response.text.replace(alpha.plan_arn, "")
        secrets = (alpha.account_id, "alpha secret output", *(() if has_ids else Alpha.names))
        leaked = [n for n in secrets if n in shown]
        assert not leaked, (method, path, leaked)
    assert tried >= 20
    assert _alpha_state(server) == before
    assert server.sagemaker(alpha.credentials).list_training_plans()["TrainingPlanSummaries"] == plans_before


def test_forms_without_a_valid_csrf_token_are_refused(
    fast_shared_server: InProcessServer, alpha: Alpha, beta: Console
) -> None:
    server = fast_shared_server
    own_offering = _search(server.sagemaker())  # the administrator's: beta could not buy it anyway
    other = Console(server)
    other.sign_in(alpha.credentials)
    other.get("/console/plans")
    before = _alpha_state(server)
    admin = Console(server)
    admin.sign_in(ADMIN)
    admin.get("/console/plans")
    for route in _console_routes():
        if "POST" not in route.methods:
            continue
        path = _fill(route.path, {"invoice": str(alpha.invoice_id)})
        for token in ("", "forged", other.token):
            for console in (beta, admin):
                response = console.post(
                    path, {"offering_id": own_offering, "plan_name": "no-token"}, token=token
                )
                assert response.status_code == 403, (path, token, response.status_code)
    assert _alpha_state(server) == before
    assert beta.get("/console/plans").status_code == 200  # still signed in: sign-out needed its token too


def test_a_session_ends_with_its_key_and_at_sign_out(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    credentials = server.new_account("gamma")
    console = Console(server)
    wrong = console.sign_in(Credentials(credentials.access_key, "not-the-secret"))
    assert wrong.status_code == 400 and 'id="secret_access_key-error"' in wrong.text
    assert console.get("/console/plans").status_code == 303  # not signed in
    assert console.sign_in(credentials).headers["location"] == "/console/plans"
    page = console.get("/console/plans")
    assert page.status_code == 200 and "gamma" in page.text
    cookie = console.http.cookies["hyperplan_console"]
    assert "HttpOnly" in console.http.get("/console/sign-in").headers.get("set-cookie", "HttpOnly")
    tampered = cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB")
    assert (
        httpx.get(f"{server.url}/console/plans", cookies={"hyperplan_console": tampered}).status_code == 303
    )
    assert console.post("/console/sign-out", {}).status_code == 303
    assert console.get("/console/plans").status_code == 303
    # signed in again, then the key is revoked: the session ends at once
    console.sign_in(credentials)
    assert console.get("/console/plans").status_code == 200
    server.native(credentials).post("/api/v1/keys")  # a second key: the last active one is never deleted
    server.native().delete(f"/api/v1/keys/{credentials.access_key}")
    assert console.get("/console/plans").headers["location"].startswith("/console/sign-in")
    assert console.post("/console/offerings", {"target": "training-job"}).status_code == 401


def test_bad_input_is_shown_next_to_its_field_and_changes_nothing(
    fast_shared_server: InProcessServer, beta: Console
) -> None:
    beta.get("/console/offerings")
    search = {
        "target": "hyperpod-cluster",
        "instance_type": P5,
        "instance_count": "many",
        "duration_days": "10",
    }
    response = beta.post("/console/offerings", search)
    assert response.status_code == 400 and 'id="instance_count-error"' in response.text
    response = beta.post("/console/offerings", {**search, "instance_count": "3"})
    assert (
        response.status_code == 400 and 'id="instance_count-error"' in response.text
    )  # not an allowed count
    response = beta.post("/console/offerings", {**search, "instance_count": "1"})
    offering = re.findall(r'name="offering_id" value="([^"]+)"', response.text)[0]
    response = beta.post("/console/offerings/purchase", {"offering_id": offering, "plan_name": "no spaces"})
    assert response.status_code == 400 and 'id="plan_name-error"' in response.text
    response = beta.post(
        "/console/new-cluster",
        {"cluster_name": "c", "group_1_name": "w", "group_1_type": M5, "group_1_count": "x"},
    )
    assert response.status_code == 400 and 'id="group_1_count-error"' in response.text
    assert "This account has no training plans yet" in beta.get("/console/plans").text
    assert "This account has no clusters." in beta.get("/console/clusters").text


def test_a_throttled_console_action_says_so(fast_shared_server: InProcessServer, beta: Console) -> None:
    server = fast_shared_server
    name = re.search(r"Account <strong>([^<]+)</strong>", beta.get("/console/plans").text).group(1)  # type: ignore[union-attr]
    server.native().call(
        "PATCH", f"/api/v1/accounts/{name}", body={"RateLimits": {"search": {"Rate": 0.001, "Burst": 1}}}
    )
    search = {"target": "hyperpod-cluster", "instance_type": P5, "instance_count": "1", "duration_days": "1"}
    assert beta.post("/console/offerings", search).status_code == 200
    refused = beta.post("/console/offerings", search)
    assert (
        refused.status_code == 429 and "Too many requests" in refused.text and "try again in" in refused.text
    )


SUBNETS = {
    "us-west-2a": "subnet-0a1b2c3d4e5f60001",
    "us-west-2b": "subnet-0a1b2c3d4e5f60003",
    "us-west-2c": "subnet-0a1b2c3d4e5f60005",
}


def test_the_instance_capacity_choice_lists_only_plans_the_binding_rules_accept(
    fast_shared_server: InProcessServer, alpha: Alpha
) -> None:
    server = fast_shared_server
    credentials = server.new_account("delta")
    client = server.sagemaker(credentials)
    pod = client.create_training_plan(TrainingPlanName="delta-pod", TrainingPlanOfferingId=_search(client))
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"]
    client.create_training_plan(TrainingPlanName="delta-jobs", TrainingPlanOfferingId=offering)
    console = Console(server)
    console.sign_in(credentials)
    page = console.get("/console/new-cluster").text
    options = re.findall(r'<option value="(arn:[^"]+)" data-instance-type="([^"]+)"', page)
    assert options == [(pod["TrainingPlanArn"], P5)] * 2  # each group row offers it, for its own type only
    other = Console(server)
    other.sign_in(alpha.credentials)
    assert "Plan alpha-plan" not in other.get("/console/new-cluster").text  # Pending: not yet usable
    zone = client.describe_training_plan(TrainingPlanName="delta-pod")["ReservedCapacitySummaries"][0][
        "AvailabilityZone"
    ]
    elsewhere = next(subnet for name, subnet in SUBNETS.items() if name != zone)
    form = {
        "cluster_name": "delta-cluster",
        "subnets": elsewhere,
        "group_1_name": "worker",
        "group_1_type": P5,
        "group_1_count": "1",
        "group_1_capacity": pod["TrainingPlanArn"],
    }
    refused = console.post("/console/new-cluster", form)
    assert refused.status_code == 400 and 'id="group_1_capacity-error"' in refused.text
    assert pod["TrainingPlanArn"] not in re.findall(r'<option value="(arn:[^"]+)"', refused.text)
    assert client.list_clusters()["ClusterSummaries"] == []
    created = console.post("/console/new-cluster", {**form, "subnets": SUBNETS[zone]})
    assert created.headers["location"] == "/console/clusters/delta-cluster?notice=created"
    groups = client.describe_cluster(ClusterName="delta-cluster")["InstanceGroups"]
    assert [(g["InstanceGroupName"], g["TrainingPlanArn"]) for g in groups] == [
        ("worker", pod["TrainingPlanArn"])
    ]
    group = {"group_1_name": "tools", "group_1_type": M5, "group_1_count": "1", "group_1_capacity": ""}
    added = console.post("/console/clusters/delta-cluster/groups", group)
    assert added.headers["location"] == "/console/clusters/delta-cluster?notice=group-added"
    again = console.post("/console/clusters/delta-cluster/groups", {**group, "group_1_name": "worker"})
    assert again.status_code == 400 and 'id="group_1_name-error"' in again.text
    groups = client.describe_cluster(ClusterName="delta-cluster")["InstanceGroups"]
    assert [(g["InstanceGroupName"], g.get("TrainingPlanArn")) for g in groups] == [
        ("worker", pod["TrainingPlanArn"]),
        ("tools", None),
    ]


def test_search_times_are_read_as_the_cli_reads_them(fast_shared_server: InProcessServer) -> None:
    # One time syntax for the console's forms and the CLI (core/user_times.py): `+3d` counts from the
    # service clock (this server's manual one), a bare date is midnight UTC, and anything else is refused
    # next to its field, naming the value and the forms it may take.
    server = fast_shared_server
    credentials = server.new_account("gamma-times")
    console = Console(server)
    assert console.sign_in(credentials).status_code == 303
    console.get("/console/offerings")
    search = {"target": "training-job", "instance_type": P5, "instance_count": "1", "duration_days": "1"}
    refused = console.post("/console/offerings", {**search, "start_after": "tomorrow"})
    said = html.unescape(refused.text)
    assert refused.status_code == 400 and 'id="start_after-error"' in refused.text
    assert "Start after: 'tomorrow' is not a time; give a date (2026-12-07, midnight UTC)" in said
    assert "now, or a time from now (+3d, +12h" in said

    now = service_now(server)
    found = console.post("/console/offerings", {**search, "start_after": "+3d", "end_before": "+9d"})
    api = server.sagemaker(credentials).search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=1,
        DurationHours=24,
        TargetResources=["training-job"],
        StartTimeAfter=now + timedelta(days=3),
        EndTimeBefore=now + timedelta(days=9),
    )["TrainingPlanOfferings"]
    assert api and found.status_code == 200
    tables = re.findall(r'<table class="segments">(.*?)</table>', found.text, re.S)
    shown = [[_instant(t) for t in re.findall(r'<time datetime="([^"]+)"', table)] for table in tables]
    expected = [
        [t for s in offering["ReservedCapacityOfferings"] for t in (s["StartTime"], s["EndTime"])]
        for offering in api
    ]
    assert shown == expected
    assert min(times[0] for times in shown) >= now + timedelta(days=3)
    console.http.close()


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_plans_list_is_paged_latest_first(
    fast_shared_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A year of plans is pages away: each page lists a few, latest start first, and links to the next;
    a page token the list did not give is refused, naming it."""
    from hyperplan.services.orchestration import console_views

    monkeypatch.setattr(console_views, "PLANS_PAGE", 2)
    server = fast_shared_server
    credentials = server.new_account("epsilon")
    client = server.sagemaker(credentials)
    for name, days in (("eps-first", 1), ("eps-second", 2), ("eps-third", 3)):
        start = service_now(server) + timedelta(days=2 * days + 1)
        offering = client.search_training_plan_offerings(
            InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"],
            StartTimeAfter=start, EndTimeBefore=start + timedelta(days=2),
        )["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"]  # fmt: skip
        client.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering)
    console = Console(server)
    console.sign_in(credentials)
    first = console.get("/console/plans").text
    assert re.findall(r">(eps-[a-z]+)</a>", first) == ["eps-third", "eps-second"]
    older = html.unescape(re.search(r'href="(/console/plans\?page=[^"]+)">Earlier plans', first)[1])
    second = console.get(older).text
    assert re.findall(r">(eps-[a-z]+)</a>", second) == ["eps-first"]
    assert "Earlier plans" not in second and "Latest plans" in second
    refused = console.get("/console/plans?page=not-a-token")
    assert refused.status_code == 400 and "NextToken" in refused.text
