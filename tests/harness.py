"""Real servers for tests: `hyperplan serve` as a child process on loopback, with its own data directory.

Nothing here is a mock: the tests talk to the server with boto3, the `aws` CLI and our own client,
exactly as users do.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from botocore.parsers import QueryParser
from botocore.validate import ParamValidator

from hyperplan.backends.layout import MARK_VARIABLE
from hyperplan.cli.client import NativeClient
from hyperplan.signing import Credentials
from hyperplan.wire import s3_xml
from hyperplan.wire.s3_responses import ENVIRONMENT as CHECK_RESPONSES
from hyperplan.wire.validate import check_output
from tests.forkserver import ForkedProcess, start_server_process
from tests.postgres import default_database_url
from tests.processes import end_marked

ADMIN = Credentials("AKHPTESTADMIN0000001", "test-admin-secret-key-000000000000000000")

SERVER_START = datetime(2026, 12, 31, 23, 50, tzinfo=UTC)
"""Where a test server's service clock starts unless its test chooses another instant: awkward on
purpose, 10 minutes before a day's, a month's and a year's end and 12 h 20 min past the day's 11:30
boundary, so a test that assumes an hour, a date or a boundary nearby fails here, not at random in CI."""
REGION = "us-west-2"
BIN = Path(sys.executable).parent


RAW_HTTP = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
"""The client of raw requests (bodies, headers and signatures boto3 would never send). `httpx.post()`
builds a client, and with it a TLS context, for every call: about 40 ms of CPU, more than the request.
Without keep-alive each request still goes on a connection of its own, as with `httpx.post()`."""


def check_response_shape(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """botocore hook: a 200 answer must match the operation's output shape exactly."""
    if response_dict["status_code"] != 200:
        return
    body = response_dict["body"] or b""
    declared = response_dict["headers"].get("content-length")
    if declared is not None and int(declared) != len(body):
        # A server killed while answering: the client cannot know the outcome, so neither does the test.
        raise ConnectionError(f"truncated response: {len(body)} of {declared} bytes")
    check_output(operation_model, json.loads(body or b"{}"))


def check_query_response(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """botocore hook for the query protocol (STS): a 200 answer is ``<OpResponse><OpResult>`` holding only
    members of the output shape, of their types (wire/s3_xml.py's walk, the layout being REST-XML's), and
    what botocore's QueryParser reads of it validates against the shape."""
    if response_dict["status_code"] != 200:
        return
    shape = operation_model.output_shape
    document = ElementTree.fromstring(response_dict["body"])
    name = operation_model.name
    assert s3_xml.local_name(document) == f"{name}Response", document.tag
    wrapper = shape.serialization.get("resultWrapper") or f"{name}Result"
    children = {s3_xml.local_name(child): child for child in document}
    assert set(children) == {wrapper, "ResponseMetadata"}, sorted(children)
    problems: list[s3_xml.Problem] = []
    s3_xml.read(shape, children[wrapper], wrapper, problems)
    assert not problems, s3_xml.summary(problems)
    parsed = QueryParser().parse(response_dict, shape)
    parsed.pop("ResponseMetadata", None)
    report = ParamValidator().validate(parsed, shape)
    assert not report.has_errors(), report.generate_report()


def unisolated(data_dir: Path) -> dict[str, Any]:
    """AppConfig's isolation settings for a test's application: mode none (CI runs as root, where the
    default is mode users) and a work directory beside the data directory, in the test's directory."""
    return {"isolation": "none", "work_dir": data_dir.with_name(data_dir.name + "-work")}


def service_now(server: Server) -> datetime:
    """The server's service clock (the manual clock in most tests)."""
    return datetime.fromisoformat(server.native().get("/api/v1/clock")["Now"])


def boundary_after(moment: datetime) -> datetime:
    """The first 11:30 UTC at or after `moment`: where plan segments start and end."""
    candidate = moment.astimezone(UTC).replace(hour=11, minute=30, second=0, microsecond=0)
    return candidate if candidate >= moment else candidate + timedelta(days=1)


def wait_until(check: Callable[[], Any], timeout: float = 60) -> Any:
    """Real processes take real time: poll until `check` holds (returns truthy), or give its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def healthy(port: int) -> bool:
    """GET /healthz answered 200. Plain http.client: httpx builds a TLS context for every client it
    makes, which costs more than the poll itself on a loaded machine."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def server_mark() -> str:
    """A mark below the running test's (tests/leaks.py), of one server and whatever it starts."""
    return f"{os.environ.get(MARK_VARIABLE, 'hptest')}.s{uuid.uuid4().hex[:6]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    data_dir: Path
    clock: str = "manual"
    clock_start: datetime | None = SERVER_START  # for manual and accelerated clocks
    fleet: Path | None = None
    extra_args: Sequence[str] = ()
    bootstrap: bool = True  # False: the first start makes the administrator's keys itself
    # True: no --work-dir, the server's default (as root BASE/<store id>: services/accounts/work_root.py); the
    # test removes that root itself.
    default_work_dir: bool = False
    database_url: str | None = None  # the store (serve --database-url); None: SQLite in the data directory
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | ForkedProcess | None = None
    # The run mark (tests/leaks.py) this server and everything it starts carry: the test's own, and one
    # of the server's, so that close() can end the server's nodes and jobs, which outlive it by design.
    mark: str = field(
        default_factory=lambda: f"{os.environ.get(MARK_VARIABLE, 'hptest')}.s{uuid.uuid4().hex[:6]}"
    )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def work_dir(self) -> Path:
        """Nodes' homes, sandboxes and job trees: beside the data directory, in the test's directory."""
        return self.data_dir.with_name(self.data_dir.name + "-work")

    def start(self, timeout: float = 60) -> Server:
        if self.database_url is None:
            self.database_url = default_database_url()  # None unless HYPERPLAN_TEST_STORE=postgres
        args = [
            str(BIN / "hyperplan"),
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--clock",
            self.clock,
            "--log-level",
            "warning",
            *self.isolation_args(),
            *self.extra_args,
        ]
        if self.fleet is not None:
            args += ["--fleet", str(self.fleet)]
        if self.database_url is not None:
            args += ["--database-url", self.database_url]
        if self.clock != "wall" and self.clock_start is not None:
            args += ["--clock-start", self.clock_start.isoformat()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPLAN_BOOTSTRAP_")}
        env[MARK_VARIABLE] = self.mark
        env.setdefault(CHECK_RESPONSES, "1")  # S3's answers checked against the model (wire/s3_responses.py)
        if self.bootstrap:
            env["HYPERPLAN_BOOTSTRAP_ACCESS_KEY_ID"] = ADMIN.access_key
            env["HYPERPLAN_BOOTSTRAP_SECRET_ACCESS_KEY"] = ADMIN.secret_key
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = start_server_process(args, env, log)
        self._wait_ready(timeout)
        return self

    def isolation_args(self) -> list[str]:
        """Mode none in a work directory of the test's own, unless the test chose (the isolation tests):
        CI runs as root, where the default would be mode users in /var/lib/hyperplan/work."""
        given = " ".join(self.extra_args)
        args = [] if "--isolation" in given else ["--isolation", "none"]
        if "--work-dir" in given or self.default_work_dir:
            return args
        return [*args, "--work-dir", str(self.work_dir)]

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            if healthy(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int:
        """SIGTERM, as a service manager would; returns the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.process = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to tidy up."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):  # it may have died by itself
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self.process = None

    def close(self) -> None:
        """The end of a test: the server killed if it still runs, and every node agent, node task and
        job instance it started ended with it."""
        if self.process is not None:
            self.kill()
        end_marked(self.mark)

    def restart(self) -> Server:
        if self.process is not None:
            self.stop()
        self.port = free_port()
        return self.start()

    # -- clients ----------------------------------------------------------------------------------

    def native(self, credentials: Credentials = ADMIN) -> NativeClient:
        return NativeClient(self.url, credentials, region=REGION)

    def sagemaker(self, credentials: Credentials = ADMIN) -> Any:
        """A boto3 client whose every successful answer is checked against the model's output shape."""
        client = boto3.client(
            "sagemaker",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            config=Config(retries={"max_attempts": 1}),
        )
        client.meta.events.register("before-parse.sagemaker.*", check_response_shape)
        return client

    def new_account(self, name: str, **extra: Any) -> Credentials:
        key = self.native().post("/api/v1/accounts", {"Name": name, **extra})
        return Credentials(key["AccessKeyId"], key["SecretAccessKey"])

    def aws(self, *args: str, credentials: Credentials = ADMIN, check: bool = True) -> Any:
        """The real `aws` CLI as a subprocess; returns its parsed JSON output (or the process)."""
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_MAX_ATTEMPTS": "1",
            "AWS_PAGER": "",
        }
        process = subprocess.run(
            [str(BIN / "aws"), "--endpoint-url", self.url, "--output", "json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if not check:
            return process
        if process.returncode != 0:
            raise AssertionError(f"aws {' '.join(args)} failed ({process.returncode}): {process.stderr}")
        return json.loads(process.stdout) if process.stdout.strip() else None

    def set_clock(self, moment: datetime | str) -> None:
        """Move the manual clock to `moment` through the native API (what `hyperplan clock set` sends,
        without a process to start: tests move clocks often, and the CLI has tests of its own)."""
        text = moment.isoformat() if isinstance(moment, datetime) else moment
        self.native().post("/api/v1/clock/set", {"Time": text})

    def advance_clock(self, duration: str) -> None:
        """Advance the manual clock by `duration` ("1m", "11h59m") through the native API."""
        self.native().post("/api/v1/clock/advance", {"Duration": duration})

    def cli(
        self, *args: str, credentials: Credentials = ADMIN, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Our own `hyperplan` command as a subprocess; `stdin` is what it reads on standard input."""
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "HYPERPLAN_ENDPOINT_URL": self.url,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "COLUMNS": "200",
        }
        process = subprocess.run(
            [str(BIN / "hyperplan"), *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and process.returncode != 0:
            raise AssertionError(
                f"hyperplan {' '.join(args)} failed ({process.returncode}): "
                f"{process.stdout}\n{process.stderr}"
            )
        return process


class SignerLeavingOut(SigV4Auth):
    """botocore's own signer, told to leave some headers out of SignedHeaders as other clients may."""

    def __init__(
        self, credentials: BotoCredentials, service: str, region: str, *, leave_out: frozenset[str]
    ) -> None:
        super().__init__(credentials, service, region)
        self._leave_out = leave_out

    def headers_to_sign(self, request: AWSRequest) -> Any:
        chosen = super().headers_to_sign(request)
        for name in self._leave_out:
            del chosen[name]
        return chosen


def signed_post(
    server: Server,
    target: str | None,
    body: bytes,
    credentials: Credentials = ADMIN,
    *,
    signed_at: Any = None,
) -> httpx.Response:
    """A raw awsJson1.1 request signed by botocore itself, for bodies and targets boto3 will not send."""
    from unittest import mock

    headers = {"Content-Type": "application/x-amz-json-1.1"}
    if target is not None:
        headers["X-Amz-Target"] = target
    request = AWSRequest(method="POST", url=f"{server.url}/", data=body, headers=headers)
    signer = SigV4Auth(BotoCredentials(credentials.access_key, credentials.secret_key), "sagemaker", REGION)
    if signed_at is None:
        signer.add_auth(request)
    else:  # a client whose own clock reads `signed_at`
        with mock.patch("botocore.auth.get_current_datetime", return_value=signed_at):
            signer.add_auth(request)
    prepared = request.prepare()
    return RAW_HTTP.post(prepared.url, content=body, headers=dict(prepared.headers))


def made_os_users(data_dir: Path) -> list[str]:
    """The OS users a server made for its accounts, read from its SQLite store (also after a crash), so
    that a test can remove them whatever state it left."""
    database = data_dir / "hyperplan.db"
    if not database.exists():
        return []
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT os_user FROM accounts WHERE os_user_made AND os_user IS NOT NULL")
        return [str(user) for (user,) in rows]
