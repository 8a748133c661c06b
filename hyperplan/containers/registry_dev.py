"""A registry for development and tests: ``registry-dev up|down|status DIR [--port N] [--login USER]``.

``up`` installs Debian's ``docker-registry`` (the CNCF distribution registry) when it is missing (apt-get,
as root), writes ``DIR/config.yml`` (images under ``DIR/storage``, listening on 127.0.0.1 only), starts
the registry, waits until ``GET /v2/`` answers, writes ``127.0.0.1:PORT`` to ``DIR/address`` and prints
it, one line. The port is 5000 unless ``--port N`` names another; ``--port 0``, or 5000 already taken,
takes a free port, and says which on stderr. On a registry already up it changes nothing and prints the
same line. ``down`` ends it (exit 0 when nothing runs; the images stay in ``DIR/storage`` for the next
``up``); ``status`` exits 0 when it is up, 3 when it is not.

It serves plain HTTP, so it listens on loopback alone: push with ``podman push --tls-verify=false``
(``scripts/image-dev`` does) and declare the registry plain HTTP in the fleet file. It asks for no login,
unless ``up --login USER`` (the password read from standard input, one line; never an argument, which
any process could read) makes it ask every client for that user's: the registry's ``htpasswd``
authentication, HTTP basic, which it takes over plain HTTP too, the bcrypt hash in ``DIR/htpasswd``
(htpasswd.py). Pull and push with ``podman login --tls-verify=false`` first (``image-dev build
--authfile``), and give a server the login with ``hyperplan registries set-credentials``. An ``up`` of a
registry already up with another login, or without the one asked for, is refused: ``down`` first.

It runs as the user who ran ``up``, never through systemd. Debian's package enables a system service of
its own on install (listening on every address, port 5000; where systemd runs it also starts it): when
``up`` installs the package, it disables that service, stopping it if it runs, and says so. A system
registry that was there before ``up`` installed anything is left alone, and ``up`` falls back to a free
port if it holds 5000.

The registry carries ``HP_REGISTRY_DEV=DIR`` in its environment, and ``down`` ends every process that
carries it: nothing started here outlives ``down``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from hyperplan.containers import htpasswd
from hyperplan.containers.host_tools import (
    Refused,
    carries,
    end_marked,
    ensure_packages,
    file_tail,
    free_port,
    locked,
    port_is_free,
)

MARK_VARIABLE = "HP_REGISTRY_DEV"
PROGRAM = "docker-registry"
PACKAGES = {"docker-registry": PROGRAM}
SYSTEM_SERVICE = "docker-registry"
DEFAULT_PORT = 5000
NOT_UP = 3
START_TIMEOUT = 30.0
START_ATTEMPTS = 3  # a free port may be taken by someone else between our check and the registry's bind
REALM = "registry-dev"


@dataclass(frozen=True)
class Login:
    """The one user the registry lets in (``up --login``)."""

    username: str
    password: str = field(repr=False)  # never into a traceback


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "config.yml"
        self.storage = root / "storage"
        self.log = root / "registry.log"
        self.pid = root / "registry.pid"
        self.address = root / "address"
        self.htpasswd = root / "htpasswd"  # there while the registry asks for a login
        self.lock = root / ".lock"

    def environment(self) -> dict[str, str]:
        # REGISTRY_* variables would override the config file: none of the caller's reach the registry.
        kept = {name: value for name, value in os.environ.items() if not name.startswith("REGISTRY_")}
        return {**kept, MARK_VARIABLE: str(self.root)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="registry-dev", description="A registry for development and tests.")
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("directory", metavar="DIR", type=Path)
    parser.add_argument(
        "--port", type=int, default=None, help=f"up: the port (default {DEFAULT_PORT}; 0 for a free one)"
    )
    parser.add_argument(
        "--login",
        metavar="USER",
        help="up: let in this user alone, the password read from standard input (one line)",
    )
    arguments = parser.parse_args(argv)
    if arguments.login is not None and arguments.command != "up":
        parser.error(f"--login goes with up, not {arguments.command}")
    directory = arguments.directory.absolute()
    try:
        if arguments.command == "status":
            return 0 if running_address(Layout(directory)) is not None else NOT_UP
        if arguments.command == "down":
            down(directory)
            return 0
        login = None if arguments.login is None else Login(arguments.login, read_password(arguments.login))
        print(up(directory, arguments.port, login))
        return 0
    except Refused as refusal:
        print(f"registry-dev {arguments.command}: {refusal}", file=sys.stderr)
        return 1


# -- status -------------------------------------------------------------------------------------------


def running_address(layout: Layout) -> str | None:
    """``127.0.0.1:PORT`` of the registry `up` started for this directory, if it runs and answers."""
    try:
        pid = int(layout.pid.read_text())
        address = layout.address.read_text().strip()
    except (OSError, ValueError):
        return None
    if not carries(pid, MARK_VARIABLE, str(layout.root)):
        return None
    return address if answers(address) else None


def answers(address: str) -> bool:
    """``GET /v2/`` answers as a registry of the distribution API does: 200 without authentication, 401
    with its API version header where it asks for a login."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(f"http://{address}/v2/", timeout=2) as response:
            return int(response.status) == 200
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code == 401 and answer.headers.get("Docker-Distribution-API-Version") is not None
    except (OSError, ValueError):  # URLError is an OSError
        return False


# What a manifest may be, as Podman pushes it (OCI, or Docker's schema 2) or as a mirror keeps it (an
# index): a registry asked without these may answer 404 for a manifest it holds in another form.
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


def has_image(address: str, name: str) -> bool:
    """The registry at ``address`` (plain HTTP) holds ``name`` (``REPOSITORY:TAG``): its manifest
    answers ``HEAD /v2/REPOSITORY/manifests/TAG`` with 200."""
    repository, _, tag = name.rpartition(":")
    request = urllib.request.Request(
        f"http://{address}/v2/{repository}/manifests/{tag}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(request, timeout=5) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError, ValueError):  # HTTPError (404) is a URLError
        return False


# -- up -----------------------------------------------------------------------------------------------


def read_password(username: str) -> str:
    """One line of standard input, without its newline; asked for without echo on a terminal."""
    if sys.stdin.isatty():
        return getpass.getpass(f"registry-dev up: the password of {username}: ")
    return sys.stdin.readline().removesuffix("\n").removesuffix("\r")


def up(directory: Path, port: int | None = None, login: Login | None = None) -> str:
    """Bring the registry up on `port` (None: 5000, or a free port if 5000 is taken; 0: a free port),
    asking every client for `login` if one is given."""
    if login is not None:
        htpasswd.check_login(login.username, login.password)  # before anything is written or started
    layout = Layout(directory)
    layout.root.mkdir(parents=True, exist_ok=True)
    with locked(layout.lock):
        address = running_address(layout)
        if address is not None:
            if port and address != f"127.0.0.1:{port}":
                raise Refused(
                    f"the registry of {directory} is up at {address}, not on port {port}: "
                    f"`registry-dev down {directory}` first"
                )
            refuse_another_login(layout, login)
            return address
        end_marked(MARK_VARIABLE, str(layout.root))  # one that stopped answering, or half started
        install()
        layout.storage.mkdir(exist_ok=True)
        _write_login(layout, login)
        return _start(layout, port)


def refuse_another_login(layout: Layout, login: Login | None) -> None:
    """Refused unless the registry up asks for `login` (or for none, as none is given): it is not restarted
    for another."""
    users = _logins(layout)
    if login is None:
        if not users:
            return
        asked = "none"
    elif login.username not in users:
        asked = f"{login.username}'s"
    elif not htpasswd.matches(login.password, users[login.username]):
        asked = f"{login.username}'s with another password"
    else:
        return
    now = f"asking for {', '.join(users)}'s login" if users else "without a login"
    raise Refused(
        f"the registry of {layout.root} is up {now}, and this up asks for {asked}: "
        f"`registry-dev down {layout.root}` first"
    )


def _logins(layout: Layout) -> dict[str, str]:
    """``{user: hash}`` of the registry up (none when it asks for no login)."""
    try:
        return htpasswd.parse(layout.htpasswd.read_text())
    except FileNotFoundError:
        return {}


def _write_login(layout: Layout, login: Login | None) -> None:
    """``DIR/htpasswd`` (0600: the registry runs as this user) for a login; no file for none."""
    if login is None:
        layout.htpasswd.unlink(missing_ok=True)
        return
    fd = os.open(layout.htpasswd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(htpasswd.line(login.username, login.password))


def install() -> None:
    """apt-get install docker-registry if it is missing, then disable the service the package enabled."""
    if ensure_packages(PACKAGES):
        _quiet_system_service()


def _start(layout: Layout, requested: int | None) -> str:
    for attempt in range(1, START_ATTEMPTS + 1):
        port = _choose_port(requested)
        layout.config.write_text(config_yaml(layout, port, login=layout.htpasswd.exists()))
        address = f"127.0.0.1:{port}"
        process = _spawn(layout)
        layout.pid.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline and not answers(address):
            time.sleep(0.05)
        if process.poll() is None and answers(address):
            process.returncode = 0  # never waited for here (it outlives this command): no warning
            layout.address.write_text(address + "\n")
            return address
        what = "exited" if process.poll() is not None else f"did not answer within {START_TIMEOUT:.0f} s"
        end_marked(MARK_VARIABLE, str(layout.root))
        said = file_tail(layout.log)
        if requested or "address already in use" not in said or attempt == START_ATTEMPTS:
            raise Refused(f"the registry on {address} {what} (its log: {layout.log}):\n{said}")
    raise AssertionError("unreachable")


def _choose_port(requested: int | None) -> int:
    if requested is None:
        if port_is_free(DEFAULT_PORT):
            return DEFAULT_PORT
        port = free_port()
        print(
            f"registry-dev up: port {DEFAULT_PORT} is taken; listening on 127.0.0.1:{port}", file=sys.stderr
        )
        return port
    if requested == 0:
        return free_port()
    if not port_is_free(requested):
        raise Refused(f"port {requested} is taken on 127.0.0.1: choose another, or --port 0 for a free one")
    return requested


def config_yaml(layout: Layout, port: int, login: bool = False) -> str:
    """The registry's configuration; with `login`, it lets in the users of ``DIR/htpasswd`` alone."""
    # JSON strings are YAML's double-quoted strings: any path is quoted right.
    auth = ["auth:", "  htpasswd:", f'    realm: "{REALM}"', f"    path: {json.dumps(str(layout.htpasswd))}"]
    said = "a login (htpasswd)" if login else "no authentication"
    return "\n".join(
        [
            f"# Written by registry-dev up: plain HTTP, {said}, loopback only.",
            "version: 0.1",
            "log:",
            "  level: warn",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {json.dumps(str(layout.storage))}",
            "  delete:",
            "    enabled: true",
            "http:",
            f'  addr: "127.0.0.1:{port}"',
            f'  secret: "{secrets.token_hex(16)}"',  # without one the registry warns at every start
            *(auth if login else []),
            "",
        ]
    )


def _spawn(layout: Layout) -> subprocess.Popen[bytes]:
    with open(layout.log, "ab") as log:
        return subprocess.Popen(
            [PROGRAM, "serve", str(layout.config)],
            env=layout.environment(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
        )


def _quiet_system_service() -> None:
    """Disable the system service Debian's package just enabled (and started, where systemd runs): it
    would listen on port 5000 of every address, and nothing here uses it."""
    unit = f"{SYSTEM_SERVICE}.service"
    if Path("/run/systemd/system").is_dir():
        _run(["systemctl", "disable", "--now", unit])
        done = f"stopped and disabled {unit} (systemctl disable --now {unit})"
    else:
        script = Path(f"/etc/init.d/{SYSTEM_SERVICE}")
        if script.exists():
            _run([str(script), "stop"])  # a no-op when a policy-rc.d kept the package from starting it
        if shutil.which("systemctl"):  # works without systemd running; also updates the SysV links
            _run(["systemctl", "disable", unit])
        elif shutil.which("update-rc.d"):
            _run(["update-rc.d", SYSTEM_SERVICE, "disable"])
        done = f"disabled {unit} and stopped its init script's registry, if it ran"
    print(f"registry-dev up: installed docker-registry; {done}: it would hold port 5000", file=sys.stderr)


def _run(command: list[str]) -> None:
    try:
        subprocess.run(command, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"registry-dev up: {' '.join(command)}: {error}", file=sys.stderr)


# -- down ---------------------------------------------------------------------------------------------


def down(directory: Path) -> None:
    layout = Layout(directory)
    if not layout.root.exists():
        return
    with locked(layout.lock):
        end_marked(MARK_VARIABLE, str(layout.root))
        for path in (layout.pid, layout.address):
            path.unlink(missing_ok=True)


if __name__ == "__main__":  # `python -m hyperplan.containers.registry_dev`, as scripts/registry-dev runs it
    sys.exit(main(sys.argv[1:]))
