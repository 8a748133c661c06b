"""What `make demo` runs its walk in (hyperplan/cli/demo.py): a server of its own and the commands a user
would type against it.

A :class:`DemoSession` serves the demo fleet from a directory of its own (SQLite, the work directory,
the aws CLI's config) under the manual clock, runs the real `aws` and `hyperplan` commands against it,
printing each command line as a user could copy it and what it printed, and waits on real processes
(nodes, jobs) through boto3, since an `aws` process per poll would cost a second of CPU each. Its end
stops the server and checks that no process it started is left: nodes and jobs outlive a server by
design, so the walk must have ended them.
"""

from __future__ import annotations

import configparser
import contextlib
import http.client
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from hyperplan.backends import procfs
from hyperplan.backends.layout import MARK_VARIABLE
from hyperplan.backends.procfs import kill_until_gone

T = TypeVar("T")

PROFILE = "hyperplan"  # the profile of the credentials file a server writes at its first start
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
LEFTOVER_SETTLE = 10.0  # processes told to stop a moment ago may still be on their way out
LOG_TAIL_LINES = 20
AWS_CONFIG = f"[profile {PROFILE}]\ncli_timestamp_format = iso8601\n"
"""The aws CLI v1 prints times as they came on the wire (epoch seconds); v2 prints ISO 8601, as this asks."""


class DemoFailed(Exception):
    """A step of the walk did not turn out as it should: the message says which and what was seen."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tool(name: str) -> list[str]:
    """A command of this environment (`make` installs `aws` and `hyperplan` in .venv/bin), else PATH's."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        raise DemoFailed(f"the {name} command is not installed: `make demo` installs it in .venv/bin")
    return [found]


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when it is below it."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def _clean(environ: dict[str, str]) -> dict[str, str]:
    """The environment without the user's AWS and hyperplan settings: the demo's server and commands use
    the demo's own (keys, endpoint, store), whatever the shell it runs in has exported."""
    return {k: v for k, v in environ.items() if not k.startswith(("AWS_", "HYPERPLAN_"))}


@dataclass
class DemoSession:
    directory: Path
    clock_start: datetime
    port: int = field(default_factory=free_port)
    mark: str = field(default_factory=lambda: _demo_mark(os.environ.get(MARK_VARIABLE)))
    server: subprocess.Popen[bytes] | None = None
    _sagemaker: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def credentials_path(self) -> Path:
        return self.data_dir / "credentials"

    @property
    def aws_config_path(self) -> Path:
        return self.directory / "aws-config"

    def exports(self) -> str:
        """The shell line that gives a user's commands the environment this session's commands run in."""
        settings = {
            "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_path),
            "AWS_PROFILE": PROFILE,
            "AWS_CONFIG_FILE": str(self.aws_config_path),
            "HYPERPLAN_ENDPOINT_URL": self.url,
        }
        return "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in settings.items())

    # -- the server -----------------------------------------------------------------------------------

    def serve(self) -> None:
        """Start `hyperplan serve` on the demo fleet and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.aws_config_path.write_text(AWS_CONFIG)
        arguments = [
            *tool("hyperplan"),
            "serve",
            *("--port", str(self.port)),
            *("--data-dir", str(self.data_dir)),
            *("--work-dir", str(self.directory / "work")),
            *("--clock", "manual", "--clock-start", self.clock_start.isoformat()),
            # The demo's work as host processes of this user, in its own directory: nothing to set up, and
            # nothing (an OS user per account, a container store) left on the machine after it.
            *("--isolation", "none", "--runtime", "process"),
            *("--log-level", "warning"),
        ]
        environment = {**_clean(dict(os.environ)), MARK_VARIABLE: self.mark}
        with self.log_path.open("ab") as log:
            self.server = subprocess.Popen(
                arguments, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._healthy():
            if self.server.poll() is not None:
                raise DemoFailed(f"the server exited ({self.server.returncode}) before it was ready")
            if time.monotonic() > deadline:
                raise DemoFailed(f"the server did not answer within {READY_TIMEOUT:.0f} s")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            connection.request("GET", "/healthz")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; SIGKILL if it does not stop in time."""
        if self.server is None:
            return
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.server = None

    def leftovers(self, settle: float = LEFTOVER_SETTLE) -> list[int]:
        """The processes still carrying this session's mark (the server's nodes, tasks and job
        instances), waiting up to `settle` seconds for those on their way out."""
        deadline = time.monotonic() + settle
        while True:
            found = [pid for pid in procfs.all_pids() if pid != os.getpid() and self._marked(pid)]
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def _marked(self, pid: int) -> bool:
        mark = procfs.read_environ(pid).get(MARK_VARIABLE, "")
        return mark == self.mark or mark.startswith(self.mark + ".")

    def log_tail(self) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])

    # -- commands -------------------------------------------------------------------------------------

    def aws(self, *arguments: str) -> str:
        """`aws SERVICE OPERATION --endpoint-url URL ...`, printed and run; what it printed, returned."""
        service, operation, *rest = arguments
        return self.run(["aws", service, operation, "--endpoint-url", self.url, *rest])

    def hyperplan(self, *arguments: str) -> str:
        """Our own CLI, which finds the endpoint in HYPERPLAN_ENDPOINT_URL (the exports line)."""
        return self.run(["hyperplan", *arguments])

    def run(self, command: Sequence[str], *, stdout_to: Path | None = None) -> str:
        """Print the command as a user would type it, run it with the session's environment, print what
        it printed; `stdout_to` is a file its output goes to instead (a shell's `>`)."""
        line = shlex.join(command)
        print(f"$ {line}" + (f" > {shlex.quote(shown(stdout_to))}" if stdout_to else ""), flush=True)
        program = tool(command[0]) if command[0] in ("aws", "hyperplan") else [command[0]]
        result = subprocess.run(
            [*program, *command[1:]],
            env=self._command_environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise DemoFailed(f"`{line}` failed ({result.returncode}): {result.stderr.strip()}")
        if stdout_to is not None:
            stdout_to.write_text(result.stdout)
            return result.stdout
        output = result.stdout.rstrip("\n")
        if output:
            print(output, flush=True)
        return output

    def _command_environment(self) -> dict[str, str]:
        return {
            **_clean(dict(os.environ)),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_path),
            "AWS_PROFILE": PROFILE,
            "AWS_CONFIG_FILE": str(self.aws_config_path),
            "AWS_PAGER": "",
            "HYPERPLAN_ENDPOINT_URL": self.url,
            MARK_VARIABLE: self.mark,
        }

    # -- waiting on real processes --------------------------------------------------------------------

    def sagemaker(self) -> Any:
        """A boto3 client with the administrator's keys, for polls (imported here: only the walk needs it)."""
        if self._sagemaker is None:
            import boto3

            profile = configparser.ConfigParser()
            profile.read(self.credentials_path)
            keys = profile[PROFILE]
            self._sagemaker = boto3.client(
                "sagemaker",
                endpoint_url=self.url,
                region_name=keys["region"],
                aws_access_key_id=keys["aws_access_key_id"],
                aws_secret_access_key=keys["aws_secret_access_key"],
            )
        return self._sagemaker

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        """Poll `check` until it gives a value (real processes take real time), saying what is awaited."""
        print(f"  ... waiting for {what}", flush=True)
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DemoFailed(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.3)


def _demo_mark(inherited: str | None) -> str:
    """The run mark of the demo's server and all it starts: below the caller's (a test's), or a new one."""
    return f"{inherited}.demo" if inherited else f"hp-{secrets.token_hex(8)}"


@contextlib.contextmanager
def demo_session(directory: Path, clock_start: datetime, *, keep: bool) -> Iterator[DemoSession]:
    """A served session; at its end the server is stopped and whatever it started is ended. After a walk
    that went through, anything left is a failure of the demo, and the directory is removed unless
    `keep`; after one that failed, the directory is kept for its server's log."""
    session = DemoSession(directory, clock_start)
    try:
        session.serve()
        yield session
    except BaseException:
        session.stop()
        kill_until_gone(lambda: set(session.leftovers(settle=0.0)))
        raise
    session.stop()
    left = session.leftovers()
    kill_until_gone(lambda: set(session.leftovers(settle=0.0)))
    if left:
        raise DemoFailed(f"{len(left)} process(es) of the demo outlived it (now killed): pids {left}")
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
