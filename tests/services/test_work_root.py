"""One store per work root, without a server: the marker (written whole, read strictly, never followed),
who may use, claim or adopt a root, the store's id, and two stores of this process on one root.
(Real servers, as root and on PostgreSQL: tests/server/test_work_roots.py.)"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from sqlalchemy import delete

from hyperplan.app import AppConfig, Application
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.errors import StartRefused
from hyperplan.services.accounts import work_root
from hyperplan.services.accounts.os_users import Isolation
from hyperplan.services.accounts.work_root import StoreIdentity, Verdict
from hyperplan.store import settings
from hyperplan.store.db import Database
from hyperplan.store.schema import Setting
from hyperplan.store.urls import sqlite_url
from tests.harness import SERVER_START
from tests.postgres import Stores

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
OURS = StoreIdentity("a" * 32, predates_ids=False)
UPGRADED = StoreIdentity("a" * 32, predates_ids=True)
OTHER = "b" * 32


def test_a_marker_names_the_store_and_nothing_else() -> None:
    text = work_root.marker_text(OURS.store_id)
    assert json.loads(text) == {"store_id": OURS.store_id}
    assert work_root.store_of_marker(text) == OURS.store_id
    for bad in ("", "a" * 32, "{}", '{"store_id": 1}', '{"store_id": "xyz"}', f'["{"a" * 32}"]'):
        with pytest.raises(ValueError):
            work_root.store_of_marker(bad)
    with pytest.raises(ValueError):
        work_root.store_of_marker(json.dumps({"store_id": OURS.store_id, "secret": "x"}))
    with pytest.raises(ValueError):
        work_root.store_of_marker(json.dumps({"store_id": OURS.store_id.upper()}))


def test_a_claim_writes_the_marker_0644_once_and_the_first_claim_wins(tmp_path: Path) -> None:
    assert work_root.owner_of(tmp_path) is None
    assert work_root.owner_of(tmp_path / "missing") is None
    assert work_root.claim(tmp_path, OURS.store_id) == OURS.store_id
    marker = tmp_path / work_root.MARKER_NAME
    assert stat.S_IMODE(marker.stat().st_mode) == 0o644
    assert work_root.claim(tmp_path, OTHER) == OURS.store_id  # already claimed: the marker stays
    assert work_root.owner_of(tmp_path) == OURS.store_id
    assert [p.name for p in tmp_path.iterdir()] == [work_root.MARKER_NAME]  # no temporary file left


def test_a_marker_that_is_a_link_or_not_ours_refuses_the_start(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(work_root.marker_text(OTHER))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / work_root.MARKER_NAME).symlink_to(elsewhere)
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / work_root.MARKER_NAME).write_text("mine\n")
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / work_root.MARKER_NAME).write_text(" " * 5000 + work_root.marker_text(OTHER))
    directory = tmp_path / "directory"
    (directory / work_root.MARKER_NAME).mkdir(parents=True)
    for root in (linked, garbled, huge, directory):
        with pytest.raises(StartRefused, match=f"work directory {root}: its store marker"):
            work_root.owner_of(root)


def test_who_may_use_a_root() -> None:
    assert work_root.verdict(OURS.store_id, True, OURS) is Verdict.OURS
    assert work_root.verdict(OTHER, False, UPGRADED) is Verdict.ANOTHER_STORE
    assert work_root.verdict(None, False, OURS) is Verdict.CLAIM  # a new root: the first server's
    assert work_root.verdict(None, True, OURS) is Verdict.OLD_WORK  # a new store never takes old work
    assert work_root.verdict(None, True, UPGRADED) is Verdict.CLAIM  # a store from before ids does


def test_who_adopts_the_old_default_root() -> None:
    assert work_root.may_adopt_old_root(OURS.store_id, OURS, knows_work_there=False)  # marked ours
    assert not work_root.may_adopt_old_root(OTHER, UPGRADED, knows_work_there=True)  # never another's
    assert work_root.may_adopt_old_root(None, UPGRADED, knows_work_there=True)
    assert not work_root.may_adopt_old_root(None, UPGRADED, knows_work_there=False)
    assert not work_root.may_adopt_old_root(None, OURS, knows_work_there=True)  # a store made since


def test_a_root_holds_work_once_a_node_task_job_tree_or_slurm_work_is_there(tmp_path: Path) -> None:
    for place in ("backend/nodes", "backend/tasks", "jobs", "slurm", "lifecycle/node-x"):
        (tmp_path / place).mkdir(parents=True)
    assert not work_root.holds_old_work(tmp_path)  # directories made, nothing in them
    (tmp_path / "jobs" / "1").mkdir()
    assert work_root.holds_old_work(tmp_path)
    other = tmp_path / "other"
    (other / "backend" / "tasks" / "job-1-a1-algo-1").mkdir(parents=True)
    assert not work_root.holds_old_work(other)  # no record: not a task
    (other / "backend" / "tasks" / "job-1-a1-algo-1" / "task.json").write_text("{}")
    assert work_root.holds_old_work(other)


def test_slurm_work_in_the_old_default_root_refuses_the_default_naming_the_flag(tmp_path: Path) -> None:
    base = tmp_path / "work"
    (base / "slurm" / "job-1").mkdir(parents=True)
    with pytest.raises(StartRefused, match=f"pass --work-dir {base} .*to keep using it"):
        work_root.refuse_old_slurm_work(base, UPGRADED)
    work_root.refuse_old_slurm_work(base, OURS)  # a store made since: not its work
    work_root.claim(base, OTHER)
    work_root.refuse_old_slurm_work(base, UPGRADED)  # another store's root
    empty = tmp_path / "empty"
    (empty / "slurm").mkdir(parents=True)
    work_root.refuse_old_slurm_work(empty, UPGRADED)


def test_the_store_id_is_made_once_and_a_store_with_accounts_then_predates_ids(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path))
    try:
        db.migrate()
        first = work_root.store_identity(db)
        assert first == work_root.store_identity(db)
        assert not first.predates_ids
        assert len(first.store_id) == 32 and int(first.store_id, 16) >= 0
    finally:
        db.close()
    application = _application(tmp_path / "data", tmp_path / "work")
    try:
        application.bootstrap()  # the administrator: an account
    finally:
        application.stop()
    db = Database(sqlite_url(tmp_path / "data"))
    try:
        with db.write() as session:  # as a version before ids left it
            session.execute(delete(Setting).where(Setting.key == settings.STORE_ID))
        upgraded = work_root.store_identity(db)
        assert upgraded.predates_ids
        assert upgraded == work_root.store_identity(db)
    finally:
        db.close()


def test_servers_starting_at_once_on_one_store_read_one_id(tmp_path: Path, stores: Stores) -> None:
    url = stores.empty_url(tmp_path)
    first = Database(url)
    try:
        first.migrate()
    finally:
        first.close()
    databases = [Database(url) for _ in range(6)]
    found: list[str] = []
    gate = threading.Barrier(len(databases))

    def start(db: Database) -> None:
        gate.wait()
        found.append(work_root.store_identity(db).store_id)

    threads = [threading.Thread(target=start, args=(db,)) for db in databases]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for db in databases:
            db.close()
    assert len(found) == len(databases) and len(set(found)) == 1, found


def _application(data_dir: Path, work_dir: Path | None) -> Application:
    return Application(
        AppConfig(
            data_dir=data_dir,
            fleet_path=SMALL_FLEET,
            clock="manual",
            clock_start=SERVER_START,
            backend=lambda _work_dir: FakeBackend(FakeWorld()),
            isolation="none",
            work_dir=work_dir,
        )
    )


def _open_work_dir(data_dir: Path, work_dir: Path | None) -> Path:
    application = _application(data_dir, work_dir)
    try:
        return application.open().work_dir
    finally:
        application.stop()


def test_a_second_store_on_a_store_s_work_root_is_refused_and_the_same_store_is_not(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert _open_work_dir(tmp_path / "one", work) == work
    owner = work_root.owner_of(work)
    assert owner is not None
    assert _open_work_dir(tmp_path / "one", work) == work  # the same store again
    with pytest.raises(StartRefused, match=f"work directory {work} belongs to another store.*{owner}"):
        _open_work_dir(tmp_path / "two", work)
    assert work_root.owner_of(work) == owner
    assert sorted(p.name for p in work.iterdir()) == [work_root.MARKER_NAME]  # the refused left nothing


def test_a_new_store_is_refused_a_root_holding_work_from_before_ids(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "jobs" / "1" / "attempt-1").mkdir(parents=True)  # an unmarked root, as those versions left
    with pytest.raises(StartRefused, match=f"work directory {work} holds .*from before store ids"):
        _open_work_dir(tmp_path / "data", work)
    assert work_root.owner_of(work) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="the default beside the data directory is for non-root")
def test_the_default_work_root_of_a_server_not_run_as_root_is_marked_too(tmp_path: Path) -> None:
    assert _open_work_dir(tmp_path / "data", None) == tmp_path / "data-work"
    assert work_root.owner_of(tmp_path / "data-work") is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="the default under the work base is for a server run as root")
def test_as_root_each_store_s_default_work_root_is_its_own_under_the_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    monkeypatch.setenv(work_root.BASE_VARIABLE, str(base))
    one = _open_work_dir(tmp_path / "one", None)
    two = _open_work_dir(tmp_path / "two", None)
    assert one.parent == two.parent == base and one != two
    assert work_root.owner_of(one) == one.name and work_root.owner_of(two) == two.name
    assert work_root.owner_of(base) is None  # the base itself belongs to nobody
    assert stat.S_IMODE(one.stat().st_mode) == 0o711


@pytest.mark.skipif(os.geteuid() != 0, reason="the default under the work base is for a server run as root")
def test_a_slurm_store_from_before_ids_is_refused_the_new_default_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    (base / "slurm" / "job-1").mkdir(parents=True)  # as the old default root held it
    monkeypatch.setenv(work_root.BASE_VARIABLE, str(base))
    (tmp_path / "data").mkdir()
    db = Database(sqlite_url(tmp_path / "data"))
    try:
        db.migrate()
        with db.write() as session:  # the id a store of accounts got at its first start on this version
            settings.put(session, settings.STORE_ID, UPGRADED.store_id)
            settings.put(session, settings.STORE_PREDATES_IDS, "true")
        with pytest.raises(StartRefused, match=f"pass --work-dir {base} "):
            work_root.take(db, tmp_path / "data", None, Isolation.NONE, slurm=True, local=False)
        assert sorted(p.name for p in base.iterdir()) == ["slurm"]  # no new root, no marker
        given = work_root.take(db, tmp_path / "data", base, Isolation.NONE, slurm=True, local=False)
        assert given == work_root.WorkRoots(base) and work_root.owner_of(base) == UPGRADED.store_id
    finally:
        db.close()
