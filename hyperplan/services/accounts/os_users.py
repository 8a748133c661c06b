"""Isolation between accounts on this machine: the modes, accounts' OS users, and the start checks.

In mode ``users`` (the default when the server runs as root) every account's work runs as an OS user of
its own: ``hp-`` and the account's twelve-digit id, made with the account (``useradd --system``: no home,
no login shell, a group of its own and no other) and removed with it, or an existing user an
administrator named (never root, never the server's own user; left in place when the account goes).
In mode ``none`` everything runs as the server's user: accounts are not isolated from each other or from
the server, and the server says so at start.

The checks here look at permission bits, as the kernel will: "can others run this interpreter" at start,
"can this account's user read its program" at a job's launch, so that what would fail with a bare
"Permission denied" inside a tenant process fails earlier with a message naming the path.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from hyperplan.backends.base import RunAs
from hyperplan.core.id_ranges import IdRange, parse_id_range, parse_subordinate_ids
from hyperplan.errors import InternalFailure, StartRefused, ValidationError

log = logging.getLogger(__name__)

ISOLATION_ENV = "HYPERPLAN_ISOLATION"
USER_PREFIX = "hp-"
SYSTEM_PYTHON = "/usr/bin/python3"
WORK_DIR_MODE = 0o711  # every account's user passes through to its own trees; nobody lists them
NOT_ISOLATED = (
    "isolation mode 'none': accounts are NOT isolated from each other or from the server (their work "
    "runs as the server's own user and can read its data directory); run the server as root for mode "
    "'users'"
)
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_USERADD_TRIES = 20  # useradd fails while another process holds /etc/passwd's lock; it says so, exit 10


class Isolation(StrEnum):
    USERS = "users"
    """Each account's work runs as its own OS user (needs root)."""
    NONE = "none"
    """Everything runs as the server's user: no isolation between accounts."""


def choose_isolation(requested: str | None, euid: int) -> Isolation:
    """The mode asked for (``serve --isolation`` or HYPERPLAN_ISOLATION), or by default ``users`` for a
    server run as root and ``none`` otherwise. ``users`` without root is refused."""
    if requested is None or requested == "":
        return Isolation.USERS if euid == 0 else Isolation.NONE
    try:
        mode = Isolation(requested)
    except ValueError:
        raise StartRefused(f"isolation mode {requested!r}: give 'users' or 'none'") from None
    if mode is Isolation.USERS and euid != 0:
        raise StartRefused(
            "isolation mode 'users' needs a server run as root (it starts each account's work as that "
            "account's OS user); run it as root, or give --isolation none to run without isolation"
        )
    return mode


# -- the work directory -------------------------------------------------------------------------------


def check_work_dir_place(work_dir: Path, data_dir: Path) -> Path:
    """The work directory, absolute; refused inside the data directory (or as the data directory)."""
    work = Path(os.path.realpath(work_dir))
    data = Path(os.path.realpath(data_dir))
    if work == data or data in work.parents:
        raise StartRefused(
            f"work directory {work_dir}: it lies inside the data directory {data_dir}, which no tenant "
            "process may reach; give --work-dir (or [backend] work_dir) a place outside it"
        )
    return work


def make_work_dir(work_dir: Path, isolation: Isolation) -> None:
    """Create the work directory 0711 (its missing parents 0711 too). In mode ``users`` every ancestor
    must let others pass (o+x): else no account's user reaches its own trees."""
    missing = [p for p in (work_dir, *work_dir.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        os.chmod(directory, WORK_DIR_MODE)
    os.chmod(work_dir, WORK_DIR_MODE)
    if isolation is Isolation.USERS:
        closed = [p for p in work_dir.parents if not os.stat(p).st_mode & stat.S_IXOTH]
        if closed:
            raise StartRefused(
                f"work directory {work_dir}: accounts' users cannot reach it, for {closed[0]} does not let "
                "others pass (no o+x); choose a work directory outside it (say /var/lib/hyperplan/work)"
            )


# -- interpreters -------------------------------------------------------------------------------------


def closed_to_others(path: str | Path, *, run: bool = True) -> str | None:
    """Why other users cannot run the program at ``path`` (o+x on every directory on its way, o+rx on
    the file, links followed), or with ``run=False`` read the file (o+r), or None when they can."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except OSError as error:
        return f"{path}: {error.strerror}"
    for directory in reversed(target.parents):
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return f"{path}: the directory {directory} does not let other users pass (no o+x)"
    needed = stat.S_IROTH | (stat.S_IXOTH if run else 0)
    if not stat.S_ISREG(mode) or mode & needed != needed:
        what = "read and run it (needs o+rx)" if run else "read it (needs o+r)"
        return f"{path}: other users may not {what}"
    return None


def check_open_to_tenants(paths: list[tuple[str, bool]], used_by: str) -> None:
    """At a start in mode ``users``: each of ``paths`` (True: a program accounts' processes run, False:
    a file they read) must be open to other users. StartRefused names the first that is not."""
    for path, run in paths:
        why = closed_to_others(path, run=run)
        if why is not None:
            raise StartRefused(f"{used_by}: {why}; accounts' users could not run their work")


def default_interpreter(isolation: Isolation) -> str | None:
    """The Python tenant processes get when the fleet's [images] names none. None: the server's own
    (sys.executable), which is the rule in mode ``none`` and when other users can run it; otherwise the
    system's /usr/bin/python3 (a server run from a virtual environment under /root, say)."""
    if isolation is Isolation.NONE or closed_to_others(sys.executable) is None:
        return None
    return SYSTEM_PYTHON


def check_interpreters(images: dict[str, str], default: str | None) -> None:
    """At a start in mode ``users``: every interpreter of the fleet's [images], and the default one,
    must be runnable by the accounts' users. StartRefused names the first that is not."""
    for image, interpreter in sorted(images.items()):
        why = closed_to_others(interpreter)
        if why is not None:
            raise StartRefused(f"[images] {image!r}: {why}; accounts' users could not run their programs")
    if default is not None:
        why = closed_to_others(default)
        if why is not None:
            raise StartRefused(
                f"the default interpreter {why}; name one others can run in the fleet file's [images]"
            )


def unreadable_by(path: str | Path, run_as: RunAs) -> str | None:
    """Why ``run_as`` cannot read the file at ``path`` (by its uid and gid against the permission bits
    of every directory on the way and of the file), or None when it can."""
    target = Path(path)
    if not target.is_absolute():
        return None
    for directory in reversed(target.parents):
        if not _allows(directory, run_as, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return f"{path}: the account's user {run_as.user} may not enter {directory}"
    try:
        os.stat(target)
    except OSError as error:
        return f"{path}: {error.strerror}"
    if not _allows(target, run_as, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH):
        return f"{path}: the account's user {run_as.user} may not read it (Permission denied)"
    return None


def _allows(path: Path, run_as: RunAs, owner: int, group: int, other: int) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    if run_as.uid == 0:
        return True
    if info.st_uid == run_as.uid:
        return bool(info.st_mode & owner)
    if info.st_gid == run_as.gid:
        return bool(info.st_mode & group)
    return bool(info.st_mode & other)


# -- OS users -----------------------------------------------------------------------------------------


def user_name_for(account_id: str) -> str:
    return USER_PREFIX + account_id


def run_as(user: str) -> RunAs:
    """The RunAs of ``user`` as the system knows it now. ValidationError when it does not exist."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValidationError(f"OS user {user!r} does not exist on this machine.") from None
    return RunAs(user, entry.pw_uid, entry.pw_gid)


def check_named_user(user: str) -> RunAs:
    """A user an administrator names for an account: it exists, is not root, not the server's user."""
    if not _USER_NAME.fullmatch(user):
        raise ValidationError(
            f"OsUser {user!r}: an OS user name is 1-32 of letters, digits, '_', '.', '-', not starting "
            "with a digit, '.' or '-'."
        )
    found = run_as(user)
    if found.uid == 0:
        raise ValidationError(f"OS user {user!r} has uid 0: an account's work never runs as root.")
    if found.uid == os.geteuid():
        raise ValidationError(
            f"OS user {user!r} is the server's own user: an account's work never runs as it."
        )
    return found


def exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


USERS_LOCK = Path("/run/hyperplan-os-users.lock")
"""Held while a user is made (:func:`making_users`); in /run, which only root writes (unlike /run/lock,
where a tenant could make the file first and hold it)."""


@contextlib.contextmanager
def making_users() -> Iterator[None]:
    """One maker of OS users at a time on this machine, whichever server it is: groupadd and useradd check
    that an id is free before they lock the account files, so two at once can both take one id. Hold
    this from the look for a free id to the user's creation."""
    fd = os.open(USERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


IDS_GIVEN = Path("/var/lib/hyperplan/os-ids-given")
"""This machine's record of every id any hyperplan server on it handed out (one number a line): a store
knows its own, and a user another store removed leaves its id free in /etc/passwd, where this one would
otherwise find it free to hand out again. Read and appended only inside :func:`making_users`."""


def ids_given_here() -> set[int]:
    """Every id a server on this machine handed out, as its record says (none: an empty set)."""
    try:
        text = IDS_GIVEN.read_text()
    except FileNotFoundError:
        return set()
    return {int(line) for line in text.split() if line.isdigit()}


def note_given_here(value: int) -> None:
    """Add ``value`` to this machine's record, durably, before the user that has it is made."""
    _append_durably(IDS_GIVEN, f"{value}\n")


SUBORDINATE_IDS_GIVEN = Path("/var/lib/hyperplan/subordinate-ids-given")
"""This machine's record of every block of subordinate ids (containers' user namespaces) any hyperplan
server on it handed out, ``FIRST-LAST`` a line, for IDS_GIVEN's reason: a block is free in /etc/subuid
again once its account's user is removed. A file of its own beside IDS_GIVEN, so that the lines there stay
single ids for every version that reads them. Read and appended only inside :func:`making_users`."""


def blocks_given_here(record: Path = SUBORDINATE_IDS_GIVEN) -> list[IdRange]:
    """Every block a server on this machine handed out, as ``record`` says (none: an empty list)."""
    try:
        text = record.read_text()
    except FileNotFoundError:
        return []
    blocks = []
    for line in text.split():
        with contextlib.suppress(ValueError):  # a line cut short by a crash
            blocks.append(parse_id_range(line))
    return blocks


def note_block_given_here(block: IdRange, record: Path = SUBORDINATE_IDS_GIVEN) -> None:
    """Add ``block`` to ``record``, durably, before any container runs in it."""
    _append_durably(record, f"{block}\n")


def _append_durably(record: Path, line: str) -> None:
    # Its directory may be made here first, under the server's umask of 077: 0755 like /var/lib, since
    # the default work roots live below it and accounts' users must pass through to them.
    for directory in reversed([p for p in record.parents if not p.exists()]):
        directory.mkdir(exist_ok=True)
        os.chmod(directory, 0o755)
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


SUBORDINATE_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
"""Who owns which subordinate uids and gids on this machine (subuid(5)): what useradd, podman and the
newuidmap tools read."""


def subordinate_ids_held() -> list[tuple[str, IdRange]]:
    """Every entry of /etc/subuid and /etc/subgid: its owner (a user name or uid) and its ids."""
    entries = []
    for path in SUBORDINATE_FILES:
        with contextlib.suppress(FileNotFoundError):
            entries += parse_subordinate_ids(path.read_text())
    return entries


def holds_subordinate_ids(user: str, block: IdRange) -> bool:
    """Whether ``user`` has ``block`` in both /etc/subuid and /etc/subgid."""
    owners = {user, str(pwd.getpwnam(user).pw_uid)} if exists(user) else {user}
    for path in SUBORDINATE_FILES:
        try:
            entries = parse_subordinate_ids(path.read_text())
        except FileNotFoundError:
            return False
        if not any(owner in owners and held == block for owner, held in entries):
            return False
    return True


def give_subordinate_ids(user: str, block: IdRange) -> None:
    """``user``'s entries for ``block`` in /etc/subuid and /etc/subgid (``usermod``; userdel removes them
    with the user), so that every tool on the machine sees whose ids a container's are; kept if there.
    Call it inside :func:`making_users`."""
    if holds_subordinate_ids(user, block):
        return
    for path in SUBORDINATE_FILES:  # usermod refuses --add-subuids where the file does not exist
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.fchmod(fd, 0o644)  # as the system makes it, whatever the server's umask
            os.close(fd)
    argv = ["usermod", "--add-subuids", str(block), "--add-subgids", str(block), user]
    _run_user_tool(argv, f"could not give the OS user {user!r} the subordinate ids {block}")
    log.info("gave the OS user %s the subordinate uids and gids %s", user, block)


def create_user(user: str, uid: int) -> RunAs:
    """A group of its own with gid ``uid``, then the user with that uid in it and no other group, no
    home directory and no login shell (``groupadd``, ``useradd``: ids the server chose, never the tools'
    own pick, which would hand a deleted account's uid to the next). A user that exists is kept."""
    if not exists(user):
        shell = shutil.which("nologin", path="/usr/sbin:/sbin:/usr/bin:/bin") or "/bin/false"
        what = f"could not create the OS user {user!r} with uid and gid {uid}"
        if not _group_exists(user, uid):  # (a user removed by hand may have left its group)
            _run_user_tool(["groupadd", "--gid", str(uid), user], what)
        argv = ["useradd", "--uid", str(uid), "--gid", str(uid), "--no-user-group", "--no-create-home"]
        argv += ["--home-dir", "/nonexistent", "--shell", shell, user]
        try:
            _run_user_tool(argv, what)
        except InternalFailure:
            _run_user_tool(
                ["groupdel", user], f"could not remove the group {user!r} left by a failed useradd"
            )
            raise
        log.info("created the OS user %s (uid and gid %d)", user, uid)
    return run_as(user)


def remove_user(user: str) -> None:
    """``userdel`` (which takes its /etc/subuid and /etc/subgid entries with it), then its own group (made
    before the user, so userdel may leave it); a user or group already gone is fine."""
    if exists(user):
        _run_user_tool(["userdel", user], f"could not remove the OS user {user!r}")
        log.info("removed the OS user %s", user)
    if _group_exists(user):
        _run_user_tool(["groupdel", user], f"could not remove the group {user!r}")


def _group_exists(group: str, gid: int | None = None) -> bool:
    """Whether the group exists (with that gid, when one is given)."""
    try:
        found = grp.getgrnam(group)
    except KeyError:
        return False
    return gid is None or found.gr_gid == gid


def _run_user_tool(argv: list[str], what: str) -> None:
    for _ in range(_USERADD_TRIES):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 10:  # 10: the password file is locked by someone else; try again
            break
        time.sleep(0.1)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise InternalFailure(f"{what}: {argv[0]} said {detail}")
