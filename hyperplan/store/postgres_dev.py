"""A private PostgreSQL server on this host, for development and tests: ``postgres-dev up|down|status DIR``.

``up`` installs Debian's ``postgresql`` when its programs are missing (apt-get, as root), makes a cluster
in ``DIR/data`` (initdb), starts it listening on 127.0.0.1 on a free port, with its unix socket in
``DIR/socket``, creates the database ``hyperplan``, writes the server's SQLAlchemy URL to ``DIR/url`` and
prints it, one line. On a server already up it changes nothing and prints the same line. ``down`` stops
the server (exit 0 when nothing runs); ``status`` exits 0 when it is up, 3 when it is not.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` OS user (DIR is handed
to it, and every directory above DIR must let it pass, which pytest's 0700 temporary directories do
not); as any other user it runs as that user. Loopback connections are trusted (no password) and the
server does not wait for its disk (fsync off): this is a server for development and tests, never for
data anyone keeps.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

from hyperplan import host_packages

SERVER_USER = "postgres"
DATABASE = "hyperplan"
PACKAGES = ("postgresql",)
NOT_UP = 3
START_TIMEOUT = 60

# What the dev server is for: fast, disposable, loopback only. Each is a postgresql.conf setting.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "300",  # each hyperplan server keeps a pool; tests run several at once
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "logging_collector": "off",
}


class Refused(Exception):
    """Something the command cannot do; its message is printed and the command exits 1."""


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down", "status"):
        print("usage: postgres-dev up|down|status DIR", file=sys.stderr)
        return 2
    command, directory = argv[0], Path(argv[1]).absolute()
    try:
        if command == "status":
            return 0 if is_up(directory) else NOT_UP
        if command == "down":
            down(directory)
            return 0
        print(up(directory))
        return 0
    except Refused as refusal:
        print(f"postgres-dev {command}: {refusal}", file=sys.stderr)
        return 1


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.socket = root / "socket"
        self.log = root / "postgres.log"
        self.url = root / "url"

    def url_for(self, port: int) -> str:
        return f"postgresql+psycopg://{_user_name()}@127.0.0.1:{port}/{DATABASE}"


# -- who runs the server ------------------------------------------------------------------------------


def _as_root() -> bool:
    return os.geteuid() == 0


def _user_name() -> str:
    return SERVER_USER if _as_root() else pwd.getpwuid(os.geteuid()).pw_name


def _server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(_user_name())
    except KeyError:
        raise Refused(
            f"there is no {SERVER_USER!r} OS user to run PostgreSQL as (installing Debian's postgresql "
            "makes it)"
        ) from None


def _run(command: list[str], timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run one of PostgreSQL's programs as the server's user, with no test or server mark inherited."""
    if _as_root():
        command = ["runuser", "-u", SERVER_USER, "--", *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERPLAN_", "PG"))}
    env["LC_ALL"] = "C"
    try:
        return subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )
    except subprocess.TimeoutExpired:
        raise Refused(f"{' '.join(command)} did not finish within {timeout:.0f} s") from None


def check_reachable(directory: Path) -> None:
    """Refuse a DIR under a directory the server's user cannot enter (pytest's are 0700)."""
    if not _as_root():
        return  # the server runs as this user, who got here
    user = _server_user()
    groups = {user.pw_gid, *(g for g in _groups_of(user.pw_name))}
    for path in reversed(directory.parents):
        if not path.exists():
            continue
        info = path.stat()
        if info.st_uid == user.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            raise Refused(
                f"{directory} is not reachable by the {SERVER_USER!r} user, who runs PostgreSQL: {path} has "
                f"mode {stat.S_IMODE(info.st_mode):04o}; choose a directory every directory above which "
                "lets other users pass (o+x), such as one made with mkdtemp under /tmp"
            )


def _groups_of(name: str) -> list[int]:
    import grp

    return [g.gr_gid for g in grp.getgrall() if name in g.gr_mem]


# -- finding and installing PostgreSQL ------------------------------------------------------------------


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian keeps them under /usr/lib/postgresql/VER/bin)."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def install() -> Path:
    """apt-get install postgresql when its programs are missing (hyperplan/host_packages.py)."""
    found = bin_dir()
    if found is not None:
        return found
    try:
        host_packages.ensure(PACKAGES, why="postgres-dev runs its PostgreSQL server")
    except host_packages.PackagesRefused as refusal:
        raise Refused(str(refusal)) from None
    found = bin_dir()
    if found is None:
        raise Refused("postgresql installed, but no initdb is under /usr/lib/postgresql/*/bin nor on PATH")
    return found


# -- status -------------------------------------------------------------------------------------------


def running_port(layout: Layout) -> int | None:
    """The port of the server running on DIR/data, from its postmaster.pid, if it runs and answers."""
    programs = bin_dir()
    if programs is None or not (layout.data / "PG_VERSION").exists():
        return None
    if _run([str(programs / "pg_ctl"), "status", "-D", str(layout.data)]).returncode != 0:
        return None
    try:
        lines = (layout.data / "postmaster.pid").read_text().splitlines()
        port = int(lines[3])
    except (OSError, IndexError, ValueError):
        return None
    ready = _run([str(programs / "pg_isready"), "-q", "-h", str(layout.socket), "-p", str(port)])
    return port if ready.returncode == 0 else None


def is_up(directory: Path) -> bool:
    layout = Layout(directory)
    port = running_port(layout)
    return port is not None and _read_url(layout) == layout.url_for(port)


def _read_url(layout: Layout) -> str | None:
    try:
        return layout.url.read_text().strip()
    except OSError:
        return None


# -- up and down ----------------------------------------------------------------------------------------


def up(directory: Path) -> str:
    layout = Layout(directory)
    check_reachable(directory)
    port = running_port(layout)
    if port is not None:
        url = layout.url_for(port)
        _create_database(layout, port)
        _write_url(layout, url)
        return url
    programs = install()
    user = _server_user()
    for path in (layout.root, layout.socket):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o755)  # the url file is for everyone; the cluster's files are in data/, 0700
    if not (layout.data / "PG_VERSION").exists():
        if layout.data.exists():
            shutil.rmtree(layout.data)  # an initdb cut short
        made = _run(
            [
                str(programs / "initdb"), "-D", str(layout.data), "-U", user.pw_name, "--auth=trust",
                "--encoding=UTF8", "--locale=C", "--no-sync",
            ],
            timeout=120,
        )  # fmt: skip
        if made.returncode != 0:
            raise Refused(f"initdb failed:\n{_tail(made.stdout + made.stderr)}")
        with open(layout.data / "postgresql.conf", "a") as conf:
            conf.write("\n# postgres-dev: a disposable server for development and tests\n")
            conf.writelines(f"{name} = {value}\n" for name, value in SETTINGS.items())
    port = _free_port()
    started = _run(
        [
            str(programs / "pg_ctl"), "start", "-D", str(layout.data), "-l", str(layout.log), "-w",
            "-t", str(START_TIMEOUT), "-o", f"-p {port} -k {layout.socket}",
        ],
        timeout=START_TIMEOUT + 10,
    )  # fmt: skip
    if started.returncode != 0:
        raise Refused(f"pg_ctl start failed:\n{_tail(started.stdout + started.stderr)}\n{_log_tail(layout)}")
    url = layout.url_for(port)
    _create_database(layout, port)
    _write_url(layout, url)
    return url


def down(directory: Path) -> None:
    layout = Layout(directory)
    programs = bin_dir()
    if programs is None or not (layout.data / "PG_VERSION").exists():
        return
    if _run([str(programs / "pg_ctl"), "status", "-D", str(layout.data)]).returncode != 0:
        return
    stopped = _run([str(programs / "pg_ctl"), "stop", "-D", str(layout.data), "-m", "fast", "-w"])
    if stopped.returncode != 0:
        raise Refused(f"pg_ctl stop failed:\n{_tail(stopped.stdout + stopped.stderr)}")


def _create_database(layout: Layout, port: int) -> None:
    programs = bin_dir()
    assert programs is not None
    psql = [str(programs / "psql"), "-X", "-q", "-h", str(layout.socket), "-p", str(port), "-d", "postgres"]
    exists = _run([*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"])
    if exists.returncode != 0:
        raise Refused(f"the server does not answer psql:\n{_tail(exists.stderr)}")
    if exists.stdout.strip() != "1":
        made = _run([*psql, "-c", f"CREATE DATABASE {DATABASE}"])
        if made.returncode != 0:
            raise Refused(f"could not create the database {DATABASE}:\n{_tail(made.stderr)}")


def _write_url(layout: Layout, url: str) -> None:
    if _read_url(layout) != url:
        layout.url.write_text(url + "\n")
        layout.url.chmod(0o644)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _log_tail(layout: Layout) -> str:
    try:
        return _tail(layout.log.read_text(errors="replace"))
    except OSError:
        return ""
