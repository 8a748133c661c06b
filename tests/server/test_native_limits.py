"""The native API's limits: every number in range where it enters, bodies parsed with bounded depth, and
the same answer for an account that exists and one that does not (docs/API.md, "Limits")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.fake import Program
from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import Server, wait_until
from tests.inprocess import InProcessServer
from tests.server.native_raw import native_error, signed_native

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
TOO_BIG_ID = str(10**23)
MAX_ID = 2**31 - 1  # the store's integer, 32 bits on PostgreSQL


def refused(server: Server, method: str, path: str, body: bytes = b"", **kwargs: Any) -> dict[str, Any]:
    response = signed_native(server, method, path, body, **kwargs)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    return native_error(response)


def account(server: Server, name: str) -> dict[str, Any]:
    found = [a for a in server.native().get("/api/v1/accounts")["Accounts"] if a["Name"] == name]
    assert len(found) == 1
    return dict(found[0])


def cli_refusal(server: Server, *args: str) -> str:
    process = server.cli(*args, check=False)
    assert process.returncode == 1, (process.stdout, process.stderr)
    return process.stderr


# -- bodies --------------------------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """{"Name": [[...]]}: the object is one level, each array another."""
    return b'{"Name": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000, nested(33)],
    ids=["arrays-100000-deep", "objects-5000-deep", "one-level-too-deep"],
)
def test_deeply_nested_bodies_are_refused_before_they_are_parsed(
    fast_shared_server: Server, body: bytes
) -> None:
    before = fast_shared_server.native().get("/api/v1/accounts")
    error = refused(fast_shared_server, "POST", "/api/v1/accounts", body)
    assert error["Code"] == "SerializationException"
    assert "more than 32 levels deep" in error["Message"]
    assert fast_shared_server.native().get("/api/v1/accounts") == before


def test_a_body_at_the_depth_limit_is_parsed_and_its_field_checked(fast_shared_server: Server) -> None:
    error = refused(fast_shared_server, "POST", "/api/v1/accounts", nested(32))
    assert error == {"Code": "ValidationException", "Message": error["Message"]}
    assert error["Message"].startswith("Name must be a string")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"Name": NaN}', "NaN is not a JSON number"),
        (b'{"Name": Infinity}', "Infinity is not a JSON number"),
        (b'{"Name": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"Name": ' + b"7" * 5000 + b"}", "more than 100 digits"),
        (b'{"Name": 1e99999999999999999999}', "out of any range"),
        (b'{"Name": "\\ud800"}', "unpaired surrogate"),
        (b'{"Name": "\xff"}', "not UTF-8"),
        (b'{"Name": ' + b"[1," * 6000 + b"1" + b"]" * 1 + b"]" * 5999 + b"}", "levels deep"),
        (b'{"Name": [' + b"1," * 10_000 + b"1]}", "more than 10000 members"),
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "5000-digits",
        "exponent",
        "surrogate",
        "latin1",
        "deep",
        "wide",
    ],
)
def test_what_strict_json_does_not_hold_is_a_serialization_error(
    fast_shared_server: Server, body: bytes, says: str
) -> None:
    error = refused(fast_shared_server, "POST", "/api/v1/accounts", body)
    assert error["Code"] == "SerializationException" and says in error["Message"], error


def test_unknown_members_and_query_parameters_are_named(fast_shared_server: Server) -> None:
    error = refused(fast_shared_server, "POST", "/api/v1/accounts", b'{"Name": "typo", "Admn": true}')
    assert error["Code"] == "ValidationException"
    assert "'Admn'" in error["Message"] and "Admin, Name, OsUser, PaymentMode" in error["Message"]
    error = refused(fast_shared_server, "GET", "/api/v1/fleet?dayz=3")
    assert error["Code"] == "ValidationException" and "'dayz'" in error["Message"]
    names = [a["Name"] for a in fast_shared_server.native().get("/api/v1/accounts")["Accounts"]]
    assert "typo" not in names


# -- ids, quotas, budgets, page sizes ------------------------------------------------------------------


def test_invoice_and_webhook_ids_past_the_column_are_refused_naming_the_range(
    fast_shared_server: Server,
) -> None:
    for args in (
        ("invoices", "approve", TOO_BIG_ID),
        ("invoices", "reject", TOO_BIG_ID, "--reason", "no"),
        ("webhooks", "remove", TOO_BIG_ID),
        ("webhooks", "deliveries", TOO_BIG_ID),
    ):
        stderr = cli_refusal(fast_shared_server, *args)
        assert "ValidationException" in stderr and f"from 1 to {MAX_ID}" in stderr, (args, stderr)
    # The largest id is in range: it is simply not there.
    with pytest.raises(ApiError) as missing:
        fast_shared_server.native().post(f"/api/v1/invoices/{MAX_ID}/approve")
    assert missing.value.code == "ResourceNotFound"


@pytest.mark.parametrize("text", ["²", "١٢", "-1", "0", "1.0", "0x10", " 1"])
def test_ids_are_plain_decimal_digits(fast_shared_server: Server, text: str) -> None:
    from urllib.parse import quote

    for path in (f"/api/v1/invoices/{quote(text)}/approve", f"/api/v1/webhooks/{quote(text)}"):
        method = "POST" if path.endswith("approve") else "DELETE"
        error = refused(fast_shared_server, method, path)
        assert error["Code"] == "ValidationException" and "from 1 to" in error["Message"], (path, error)


@pytest.mark.parametrize("text", ["²", "0", "just-past", "9" * 30, "-3", "1.5", ""])
@pytest.mark.parametrize(
    ("path", "name", "high"),
    [("/api/v1/fleet", "days", 400), ("/api/v1/webhooks/1/deliveries", "limit", 500)],
)
def test_query_numbers_are_plain_digits_in_range(
    fast_shared_server: Server, path: str, name: str, high: int, text: str
) -> None:
    from urllib.parse import quote

    value = str(high + 1) if text == "just-past" else text
    error = refused(fast_shared_server, "GET", f"{path}?{name}={quote(value)}")
    assert error["Code"] == "ValidationException", error
    assert f"{name} must be a whole number from 1 to {high}" in error["Message"]


def test_quotas_past_the_maximum_are_refused_and_nothing_changes(fast_shared_server: Server) -> None:
    fast_shared_server.new_account("quota-team")
    before = account(fast_shared_server, "quota-team")
    for option in ("--max-plans", "--max-instances"):
        for value in (str(10**30), "0"):  # 0 too: the CLI sends it rather than dropping it as unset
            stderr = cli_refusal(fast_shared_server, "accounts", "update", "quota-team", option, value)
            assert "ValidationException" in stderr and "from 1 to 1000000" in stderr, stderr
    for value in (0, -1, 1_000_001, 2.5, "10", True):
        with pytest.raises(ApiError) as bad:
            fast_shared_server.native().call(
                "PATCH", "/api/v1/accounts/quota-team", body={"Quotas": {"MaxActivePlans": value}}
            )
        assert bad.value.code == "ValidationException"
        assert "Quotas.MaxActivePlans must be a whole number from 1 to 1000000" in bad.value.message
    assert account(fast_shared_server, "quota-team") == before
    fast_shared_server.cli("accounts", "update", "quota-team", "--max-plans", "1000000")
    assert account(fast_shared_server, "quota-team")["Quotas"]["MaxActivePlans"] == 1_000_000


@pytest.mark.parametrize("amount", ["1e999999", "-5"])
def test_the_cli_refuses_budgets_outside_0_to_the_maximum(fast_shared_server: Server, amount: str) -> None:
    name = f"budget-{uuid.uuid4().hex[:8]}"
    fast_shared_server.new_account(name, PaymentMode="budget")
    fast_shared_server.cli("accounts", "update", name, "--budget", "100.00")
    before = account(fast_shared_server, name)
    ledger = fast_shared_server.native().get(f"/api/v1/accounts/{name}/ledger")
    for option in ("--budget", "--add-budget"):
        stderr = cli_refusal(fast_shared_server, "accounts", "update", name, f"{option}={amount}")
        assert "ValidationException" in stderr and "from 0 to 1000000000000 USD" in stderr, stderr
        assert "at most 2 decimal places" in stderr
    assert account(fast_shared_server, name) == before
    assert fast_shared_server.native().get(f"/api/v1/accounts/{name}/ledger") == ledger


@pytest.mark.parametrize(
    "amount",
    ["NaN", "Infinity", "1.001", "1000000000000.01", "+5", " 5", "5e2", "1_000", "0x10", "", 5, 5.5, True],
)
def test_budgets_are_plain_decimal_strings_in_range(fast_shared_server: Server, amount: object) -> None:
    name = f"budget-{uuid.uuid4().hex[:8]}"
    fast_shared_server.new_account(name, PaymentMode="budget")
    before = account(fast_shared_server, name)
    for member in ("Budget", "AddBudget"):
        with pytest.raises(ApiError) as bad:
            fast_shared_server.native().call("PATCH", f"/api/v1/accounts/{name}", body={member: amount})
        assert bad.value.code == "ValidationException", bad.value
        assert bad.value.message.startswith(f"{member} must be a decimal string from 0 to 1000000000000 USD")
    assert account(fast_shared_server, name) == before


def test_budgets_up_to_the_maximum_are_kept_exactly(fast_shared_server: Server) -> None:
    fast_shared_server.new_account("rich-team", PaymentMode="budget")
    fast_shared_server.cli("accounts", "update", "rich-team", "--budget", "999999999999.99")
    assert account(fast_shared_server, "rich-team")["Budget"] == "999999999999.99"
    fast_shared_server.cli("accounts", "update", "rich-team", "--add-budget", "0.01")
    assert account(fast_shared_server, "rich-team")["Budget"] == "1000000000000.00"
    stderr = cli_refusal(fast_shared_server, "accounts", "update", "rich-team", "--add-budget", "0.01")
    assert "ValidationException" in stderr and "over the maximum of 1000000000000" in stderr
    ledger = fast_shared_server.native().get("/api/v1/accounts/rich-team/ledger")["Entries"]
    assert [e["Amount"] for e in ledger] == ["999999999999.99", "0.01"]


# -- the same answer whether an account exists or not --------------------------------------------------


def test_a_ledger_answer_does_not_say_whether_an_account_exists(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("ledger-reader")
    fast_shared_server.new_account("ledger-other")
    answers = []
    for name in ("ledger-other", "admin", "no-such-account", "000000000000"):
        with pytest.raises(ApiError) as denied:
            fast_shared_server.native(team).get(f"/api/v1/accounts/{name}/ledger")
        answers.append((denied.value.status, denied.value.code, denied.value.message))
    assert len(set(answers)) == 1, answers
    assert answers[0][:2] == (403, "AccessDeniedException")
    own = account(fast_shared_server, "ledger-reader")
    for ref in ("ledger-reader", own["AccountId"]):
        assert (
            fast_shared_server.native(team).get(f"/api/v1/accounts/{ref}/ledger")["AccountId"]
            == own["AccountId"]
        )


def test_other_accounts_invoices_and_plan_events_are_denied_alike(fast_shared_server: Server) -> None:
    """Before: another account named in the query was ignored for non-administrators; now it is refused
    as the ledger is, the same whether it exists or not."""
    team = fast_shared_server.new_account("query-reader")
    for path in ("/api/v1/invoices", "/api/v1/plans/some-plan/events"):
        answers = set()
        for name in ("admin", "no-such-account"):
            with pytest.raises(ApiError) as denied:
                fast_shared_server.native(team).get(path, account=name)
            answers.add((denied.value.status, denied.value.code, denied.value.message))
        assert len(answers) == 1 and next(iter(answers))[:2] == (403, "AccessDeniedException"), answers
    assert fast_shared_server.native(team).get("/api/v1/invoices", account="query-reader") == {"Invoices": []}
    with pytest.raises(ApiError) as missing:
        fast_shared_server.native(team).get("/api/v1/plans/some-plan/events", account="query-reader")
    assert missing.value.code == "ResourceNotFound"


def test_admin_routes_refuse_others_before_looking_anything_up(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("prober")
    for path, method in (
        ("/api/v1/accounts/admin", "PATCH"),
        ("/api/v1/accounts/no-such-account", "PATCH"),
        ("/api/v1/accounts/admin/keys", "POST"),
        ("/api/v1/accounts/no-such-account/keys", "POST"),
        ("/api/v1/accounts/admin/plans/p/cancel", "POST"),
        ("/api/v1/accounts/no-such-account/plans/p/cancel", "POST"),
    ):
        error = refused(fast_shared_server, method, path, b'{"Quotas": "x"}', credentials=team)
        assert error["Code"] == "AccessDeniedException", (path, error)
        assert error["Message"] == "Account 'prober' is not an administrator.", (path, error)


# -- log cursors ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Credentials]]:
    """An in-process server on the small fleet with one finished on-demand job that printed a line (a
    program of the fake back end's world: the log is what the back end gives, as from a real process)."""
    server = InProcessServer(data_dir=tmp_path_factory.mktemp("jobs") / "data", fleet=SMALL_FLEET).start()
    printer = list(server.world.command(Program.exits(0, stdout=b"hello from the job\n")))
    try:
        team = server.new_account("log-team")
        server.sagemaker(team).create_training_job(
            TrainingJobName="printer",
            RoleArn="arn:aws:iam::123456789012:role/Training",
            AlgorithmSpecification={
                "TrainingInputMode": "File",
                "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo:1",
                "ContainerEntrypoint": printer,
            },
            OutputDataConfig={"S3OutputPath": "s3://bucket/output"},
            ResourceConfig={"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
            StoppingCondition={"MaxRuntimeInSeconds": 600},
        )
        client = server.sagemaker(team)

        def ended() -> dict[str, Any] | None:
            job = client.describe_training_job(TrainingJobName="printer")
            return job if job["TrainingJobStatus"] in ("Completed", "Failed", "Stopped") else None

        job = wait_until(ended, timeout=120)
        assert job and job["TrainingJobStatus"] == "Completed", job
        yield server, team
    finally:
        server.close()


@pytest.mark.parametrize(
    "cursor", [f"1:{2**63}", f"1:{2**40 + 1}", f"{2**63}:0", "0:0", "1:-1", "1:²", "1", "1:2:3", "x" * 100]
)
def test_log_cursors_out_of_range_are_refused(finished_job: tuple[Server, Credentials], cursor: str) -> None:
    server, team = finished_job
    with pytest.raises(ApiError) as bad:
        server.native(team).get("/api/v1/training-jobs/printer/logs", cursor=cursor)
    assert bad.value.code == "ValidationException", bad.value
    assert (
        "cursor must be ATTEMPT:OFFSET" in bad.value.message
        and "offset 0 to 1099511627776" in bad.value.message
    )


def test_log_cursors_in_range_read_on(finished_job: tuple[Server, Credentials]) -> None:
    server, team = finished_job
    first = server.native(team).get("/api/v1/training-jobs/printer/logs")
    assert "hello from the job" in first["Data"]
    last = server.native(team).get("/api/v1/training-jobs/printer/logs", cursor=f"1:{2**40}")
    assert last["Data"] == "" and last["Done"] is True
    assert "hello" in server.cli("jobs", "logs", "printer", credentials=team).stdout
