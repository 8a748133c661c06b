"""One store per work root: the store's id, the marker that names the store a work root belongs to, and
the start's choice to use, claim or refuse a root.

A work root holds the processes a server adopts at start, and adoption ends whatever it finds there that
its store does not know (services/orchestration/adoption.py); job trees are named by job number
(WORK/jobs/<job id>), which two stores both count from 1. Two stores on one root would end each other's nodes
and collide on job trees, so a root names its store in a marker file (``.hyperplan-store``, root's, 0644: the
store id and nothing secret), and a server of another store refuses to start on it. Servers of one store
(several on one PostgreSQL database, the processes of ``serve --workers``) share a root; its leader alone
adopts.

As root, the default root is BASE/<store id> (BASE: /var/lib/hyperplan/work, or $HYPERPLAN_WORK_BASE),
so servers of different stores never meet by default; otherwise it stays DATA_DIR-work. Versions before
store ids used BASE itself for every store run as root. A store those versions made (it had accounts
when it got its id) may claim that old root while it is unmarked, if some of the nodes or tasks it knows
live there: its new work goes to its own root, and the old root's work is adopted and served by a second
local back end until it ends (backends/composite.py). A store made since never claims a root that holds
such work, and a root another store marked is never touched.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import stat
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sqlalchemy import select

from hyperplan.backends.composite import holds_work
from hyperplan.backends.layout import Layout
from hyperplan.errors import StartRefused
from hyperplan.services.accounts import accounts, os_users
from hyperplan.store import settings
from hyperplan.store.db import Database
from hyperplan.store.schema import ClusterNode, TrainingJobInstance

log = logging.getLogger(__name__)

MARKER_NAME = ".hyperplan-store"
MARKER_MODE = 0o644  # tools may read which store a root belongs to; only root writes it
BASE_VARIABLE = "HYPERPLAN_WORK_BASE"
DEFAULT_BASE = Path("/var/lib/hyperplan/work")
_STORE_ID = re.compile(r"[0-9a-f]{32}")
_MARKER_CAP = 4096  # a marker is one short line; anything longer is not ours


@dataclass(frozen=True)
class StoreIdentity:
    store_id: str
    predates_ids: bool
    """The store was made by a version before store ids (it had accounts when it got its id)."""


class Verdict(StrEnum):
    OURS = "ours"
    """The root's marker names this store."""
    CLAIM = "claim"
    """Unmarked, and this store may take it: it holds no work, or the store predates ids."""
    ANOTHER_STORE = "another store"
    """Marked by another store: refused."""
    OLD_WORK = "old work"
    """Unmarked, holding work of a version before ids, and this store is newer: refused."""


@dataclass(frozen=True)
class WorkRoots:
    work_dir: Path
    old_root: Path | None = None
    """The default root of versions before store ids, when this store adopts its nodes and tasks (the
    local back end's root there is ``old_root / "backend"``)."""


# -- the store's id -----------------------------------------------------------------------------------


def store_identity(db: Database) -> StoreIdentity:
    """The store's id, made by the first start that finds none. A serial write (the writers' lock on
    PostgreSQL, BEGIN IMMEDIATE on SQLite): servers starting at once on one database all read the one id
    the first made. The bootstrap comes after this, so a store with accounts here existed before ids.
    Once made, a start only reads it."""
    with db.read() as session:
        store_id = settings.get(session, settings.STORE_ID)
        predates = settings.get(session, settings.STORE_PREDATES_IDS) == "true"
    if store_id is not None:
        return StoreIdentity(store_id, predates)
    with db.write() as session:
        store_id = settings.get(session, settings.STORE_ID)
        if store_id is None:
            store_id = secrets.token_hex(16)
            settings.put(session, settings.STORE_ID, store_id)
            if accounts.has_accounts(session):
                settings.put(session, settings.STORE_PREDATES_IDS, "true")
        predates = settings.get(session, settings.STORE_PREDATES_IDS) == "true"
    return StoreIdentity(store_id, predates)


# -- where ---------------------------------------------------------------------------------------------


def default_base() -> Path:
    """Where a server run as root makes its default work root: BASE/<store id>."""
    configured = os.environ.get(BASE_VARIABLE)
    return Path(configured).expanduser() if configured else DEFAULT_BASE


def default_root(data_dir: Path, euid: int, store_id: str, base: Path) -> Path:
    """BASE/<store id> for a server run as root, DATA_DIR-work beside the data directory otherwise."""
    if euid == 0:
        return base / store_id
    absolute = Path(os.path.abspath(data_dir))
    return absolute.with_name(absolute.name + "-work")


# -- the marker ----------------------------------------------------------------------------------------


def marker_text(store_id: str) -> str:
    return json.dumps({"store_id": store_id}) + "\n"


def store_of_marker(text: str) -> str:
    """The store id a marker names. ValueError for anything but what marker_text writes."""
    try:
        content = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(content, dict) or set(content) != {"store_id"}:
        raise ValueError('not {"store_id": ...}')
    store_id = content["store_id"]
    if not isinstance(store_id, str) or not _STORE_ID.fullmatch(store_id):
        raise ValueError("the store id is not 32 hex digits")
    return store_id


def owner_of(root: Path) -> str | None:
    """The store id the root's marker names; None when the root or its marker does not exist. A marker
    that is a link, not a regular file, or not ours refuses the start: nobody can tell whose root it is."""
    path = root / MARKER_NAME
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _bad_marker(path, error.strerror or str(error)) from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _bad_marker(path, "not a regular file")
        raw = os.read(descriptor, _MARKER_CAP + 1)
    finally:
        os.close(descriptor)
    try:
        if len(raw) > _MARKER_CAP:
            raise ValueError("too long")
        return store_of_marker(raw.decode("utf-8", errors="strict"))
    except (ValueError, UnicodeDecodeError) as error:
        raise _bad_marker(path, str(error)) from None


def _bad_marker(path: Path, why: str) -> StartRefused:
    return StartRefused(
        f"work directory {path.parent}: its store marker {path} cannot be read as one ({why}), so whose "
        "work it holds is unknown; give this server another work directory (--work-dir), or remove the "
        "marker if this store's work is the only one there"
    )


def claim(root: Path, store_id: str) -> str:
    """Mark an unmarked root as this store's; the store id the marker names afterwards (another's when a
    server of another store claimed it first). The marker is written whole and then linked into place,
    which fails if one is there: two servers claiming at once never both win."""
    descriptor, temporary = tempfile.mkstemp(prefix=MARKER_NAME + ".", dir=root)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(marker_text(store_id))
            out.flush()
            os.fchmod(out.fileno(), MARKER_MODE)
            os.fsync(out.fileno())
        try:
            os.link(temporary, root / MARKER_NAME)
        except FileExistsError:
            pass
        else:
            _sync_directory(root)
    finally:
        os.unlink(temporary)
    owner = owner_of(root)
    assert owner is not None  # linked by us or by whoever came first; nothing removes it
    return owner


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# -- who may use a root ---------------------------------------------------------------------------------


def holds_old_work(root: Path) -> bool:
    """Whether a root holds work: a node or task recorded by the local back end, a job tree, Slurm work."""
    return holds_work(root / "backend") or _has_entries(root / "jobs") or _has_entries(root / "slurm")


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False


def verdict(owner: str | None, holds_work_now: bool, identity: StoreIdentity) -> Verdict:
    """What this store may do with a work root, from its marker's owner (None: unmarked) and whether it
    holds work already."""
    if owner == identity.store_id:
        return Verdict.OURS
    if owner is not None:
        return Verdict.ANOTHER_STORE
    if holds_work_now and not identity.predates_ids:
        return Verdict.OLD_WORK
    return Verdict.CLAIM


def may_adopt_old_root(owner: str | None, identity: StoreIdentity, knows_work_there: bool) -> bool:
    """Whether this store adopts the work under the default root of versions before store ids: its own
    once it marked it; unmarked, only a store those versions made, and only if it knows work there."""
    if owner is not None:
        return owner == identity.store_id
    return identity.predates_ids and knows_work_there


def refusal(root: Path, found: Verdict, owner: str | None, identity: StoreIdentity) -> StartRefused:
    if found is Verdict.ANOTHER_STORE:
        return StartRefused(
            f"work directory {root} belongs to another store: its marker {root / MARKER_NAME} names store "
            f"{owner}, and this server's store is {identity.store_id}. A server adopts its work directory "
            "and ends whatever runs there that its store does not know, so two stores never share one: "
            "give this server a work directory of its own (--work-dir, or [backend] work_dir; as root, "
            "leaving both unset gives each store its own). If that store is gone for good, remove "
            f"{root} (and its work with it) and start again"
        )
    return StartRefused(
        f"work directory {root} holds nodes, tasks or job trees of a server from before store ids, and "
        f"this store ({identity.store_id}) is newer than that version, so it cannot be the store they "
        "belong to: give this server another work directory (--work-dir, or [backend] work_dir), or start "
        "the store they belong to on it first"
    )


# -- at start ------------------------------------------------------------------------------------------


def take(
    db: Database,
    data_dir: Path,
    configured: Path | None,
    isolation: os_users.Isolation,
    *,
    slurm: bool,
    local: bool,
) -> WorkRoots:
    """The start's work root: the configured one (``--work-dir`` or ``[backend] work_dir``), else the
    default. Refused when another store owns it; made (os_users.make_work_dir, with its checks) and
    claimed when unmarked. With the default as root, also the old default root whose work this store
    adopts (``local``: the local back end), or a refusal when its Slurm work (``slurm``) waits there."""
    identity = store_identity(db)
    base = default_base()
    euid = os.geteuid()
    defaulted_as_root = configured is None and euid == 0  # where versions before ids used `base` itself
    if defaulted_as_root and slurm:
        refuse_old_slurm_work(base, identity)  # before the new root is made
    given = configured if configured is not None else default_root(data_dir, euid, identity.store_id, base)
    root = os_users.check_work_dir_place(given, data_dir)
    owner = owner_of(root)
    found = verdict(owner, owner is None and holds_old_work(root), identity)
    if found in (Verdict.ANOTHER_STORE, Verdict.OLD_WORK):
        raise refusal(root, found, owner, identity)
    os_users.make_work_dir(root, isolation)
    if found is Verdict.CLAIM:
        owner = claim(root, identity.store_id)
        if owner != identity.store_id:  # a server of another store claimed it a moment before
            raise refusal(root, Verdict.ANOTHER_STORE, owner, identity)
        log.info("work directory %s: claimed for store %s", root, identity.store_id)
    if not (defaulted_as_root and local):
        return WorkRoots(root)
    return WorkRoots(root, old_root_to_adopt(db, base, identity))


def refuse_old_slurm_work(base: Path, identity: StoreIdentity) -> None:
    """The old default root holds Slurm work this store may own: its jobs' trees are there, and a Slurm
    back end serves one root, so the start is refused with the way to keep using it."""
    owner = owner_of(base)
    mine = owner == identity.store_id or (owner is None and identity.predates_ids)
    if mine and _has_entries(base / "slurm"):
        raise StartRefused(
            f"{base / 'slurm'} holds Slurm work a version before store ids started in the old default "
            f"work directory {base}, and a Slurm back end serves one work directory: pass --work-dir "
            f"{base} (or [backend] work_dir) to keep using it (this store then claims it), or remove "
            f"{base / 'slurm'} once that work has ended"
        )


def old_root_to_adopt(db: Database, base: Path, identity: StoreIdentity) -> Path | None:
    """The old default root, when its local back end holds work and this store may adopt it (claiming
    it if unmarked); None otherwise (a root of another store is left as it is)."""
    backend_root = base / "backend"
    if not holds_work(backend_root):
        return None
    owner = owner_of(base)
    if not may_adopt_old_root(owner, identity, owner is None and _knows_work_in(db, backend_root)):
        log.info("%s holds work this store does not own: left as it is", backend_root)
        return None
    if owner is None and claim(base, identity.store_id) != identity.store_id:
        return None  # another store's server claimed it a moment before
    return base


def _knows_work_in(db: Database, backend_root: Path) -> bool:
    """Whether a node or task this store knows has its record under ``backend_root``."""
    layout = Layout(backend_root)
    there_nodes, there_tasks = set(layout.node_ids()), set(layout.task_ids())
    with db.read() as session:
        nodes = set(session.scalars(select(ClusterNode.backend_id)))
        tasks = set(session.scalars(select(TrainingJobInstance.task_id)))
    return any(layout.node(n).spec.exists() for n in there_nodes & nodes) or any(
        layout.task(t).spec.exists() for t in there_tasks & tasks
    )
