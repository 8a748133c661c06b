"""One account's execs hold no thread the other requests need (issue 42): 64 `sleep 30` of one account run
at once while another account is answered, the 65th is throttled, and the server's total of execs binds
administrators too, answered ServiceUnavailable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hyperplan.signing import Credentials, sign_request
from tests.harness import ADMIN, REGION, Server, wait_until
from tests.processes import MarkedProcess, kill, marked

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
SLEEP = ["sleep", "30"]
# The busy account's calls come from several loopback addresses and the other account's from one more, so
# that the server's cap on connections per client address (server/fair_connections.py) stays out of it:
# what is limited here is an account's execs, wherever they come from.
BUSY_ADDRESSES = ("127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4")
OTHER_ADDRESS = "127.0.0.2"


def _start(server_factory: type[Server], tmp_path: Path, per_account: int, total: int) -> Server:
    fleet = tmp_path / "fleet.toml"
    limits = f"\n[rate_limits]\nconcurrent_exec = {per_account}\nconcurrent_exec_total = {total}\n"
    fleet.write_text(SMALL_FLEET.read_text() + limits)
    server = server_factory(data_dir=tmp_path / "data", fleet=fleet)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\ntrue\n")
    return server.start()


def _exec_path(server: Server, credentials: Credentials, cluster: str) -> str:
    """A Running node's exec route, on a new on-demand cluster of the account's."""
    client = server.sagemaker(credentials)
    client.create_cluster(
        ClusterName=cluster,
        InstanceGroups=[
            {
                "InstanceGroupName": "controller",
                "InstanceType": "ml.m5.12xlarge",
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
            }
        ],
    )

    def running() -> list[str]:
        nodes = client.list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
        return [n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"]

    found = wait_until(running)
    assert found, client.list_cluster_nodes(ClusterName=cluster)
    return f"/api/v1/clusters/{cluster}/nodes/{found[0]}/exec"


@dataclass
class Signed:
    """Native requests signed with one account's key, sent from one local address."""

    server: Server
    credentials: Credentials
    source: str
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(transport=httpx.HTTPTransport(local_address=self.source), timeout=120)

    def send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        url, data = f"{self.server.url}{path}", b"" if body is None else json.dumps(body).encode()
        headers = sign_request(
            method,
            url,
            headers={"Content-Type": "application/json"} if data else {},
            body=data,
            access_key=self.credentials.access_key,
            secret_key=self.credentials.secret_key,
            region=REGION,
        )
        return self.http.request(method, url, headers=headers, content=data)

    def exec(self, path: str, command: list[str]) -> httpx.Response:
        return self.send("POST", path, {"Command": command, "TimeoutSeconds": 120})


@contextmanager
def _callers(server: Server, credentials: Credentials, sources: tuple[str, ...]) -> Iterator[list[Signed]]:
    callers = [Signed(server, credentials, source) for source in sources]
    try:
        yield callers
    finally:
        for caller in callers:
            caller.http.close()


def _answer(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return dict(response.json())


def _error(response: httpx.Response) -> tuple[int, str, str]:
    error = response.json()["Error"]
    return response.status_code, error["Code"], error["Message"]


def _sleeping(server: Server) -> list[MarkedProcess]:
    """The server's `sleep 30` commands running now (every process it starts carries its mark)."""
    return [p for p in marked(server.mark) if p.command == " ".join(SLEEP)]


@contextmanager
def _execs(
    server: Server, callers: list[Signed], path: str, count: int
) -> Iterator[list[Future[httpx.Response]]]:
    """`count` execs of SLEEP sent at once (each on a connection of its own, the callers in turn); every
    command they started is killed on the way out, so each call returns and nothing is left running."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        calls = [pool.submit(callers[i % len(callers)].exec, path, SLEEP) for i in range(count)]
        try:
            yield calls
        finally:
            while not all(call.done() for call in calls):
                kill(_sleeping(server))
                wait_until(lambda: all(call.done() for call in calls), timeout=1)


def test_64_execs_of_one_account_leave_another_answered_and_its_65th_is_throttled(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = _start(server_factory, tmp_path, per_account=64, total=128)
    busy, quiet = server.new_account("busy"), server.new_account("quiet")
    server.native().post("/api/v1/buckets/lifecycle/grants", {"Account": "busy", "ReadOnly": True})
    path = _exec_path(server, busy, "hold")

    with (
        _callers(server, busy, BUSY_ADDRESSES) as callers,
        _callers(server, quiet, (OTHER_ADDRESS,)) as (other,),
    ):
        with _execs(server, callers, path, 64) as calls:
            assert wait_until(lambda: len(_sleeping(server)) == 64), f"{len(_sleeping(server))} of 64 running"
            # Every exec waits on its command; the other account is answered all the same.
            who = _answer(other.send("GET", "/api/v1/whoami"))
            assert who["AccountName"] == "quiet"
            assert not any(call.done() for call in calls)
            status, code, message = _error(callers[0].exec(path, SLEEP))
            assert (status, code) == (400, "ThrottlingException")
            assert "'busy' is running 64 exec calls, its limit" in message
            assert len(_sleeping(server)) == 64 and not any(call.done() for call in calls)

        answers = [_answer(call.result()) for call in calls]  # each returned once its command was killed
        assert all(answer["ExitCode"] != 0 and not answer["TimedOut"] for answer in answers), answers[:3]
        # Every slot was given back with its command: the account runs an exec again.
        again = _answer(callers[0].exec(path, ["echo", "again"]))
        assert (again["ExitCode"], again["Stdout"]) == (0, "again\n")
    assert _sleeping(server) == []


def test_the_servers_total_binds_administrators_who_pass_an_accounts_own_limit(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = _start(server_factory, tmp_path, per_account=1, total=3)
    busy = server.new_account("busy")
    server.native().post("/api/v1/buckets/lifecycle/grants", {"Account": "busy", "ReadOnly": True})
    busy_path, admin_path = _exec_path(server, busy, "hold"), _exec_path(server, ADMIN, "admin-hold")

    with (
        _callers(server, busy, BUSY_ADDRESSES[:1]) as (busy_caller,),
        _callers(server, ADMIN, BUSY_ADDRESSES[1:3]) as admin_callers,
    ):
        with (
            _execs(server, [busy_caller], busy_path, 1),
            _execs(server, admin_callers, admin_path, 2) as admins,
        ):
            assert wait_until(lambda: len(_sleeping(server)) == 3), f"{len(_sleeping(server))} of 3 running"
            assert not any(call.done() for call in admins)  # two at once: past the account limit of 1
            assert _error(busy_caller.exec(busy_path, SLEEP))[:2] == (400, "ThrottlingException")
            status, code, message = _error(admin_callers[0].exec(admin_path, SLEEP))
            assert (status, code) == (503, "ServiceUnavailable")
            assert "This server is running 3 exec calls, its most at once" in message

        assert _answer(admin_callers[0].exec(admin_path, ["true"]))["ExitCode"] == 0
