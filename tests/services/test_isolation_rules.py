"""Isolation's rules that need no root: the mode's default and refusal, the work directory's place and
reach, the permission checks on interpreters and programs, and a start's closing of the data directory.
(What the OS refuses to an account's user is shown as root in tests/server/test_isolation.py.)"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.app import AppConfig, Application, close_data_dir
from hyperplan.backends.base import RunAs
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.errors import StartRefused, ValidationError
from hyperplan.services.accounts import os_users, work_root
from hyperplan.services.accounts.os_users import Isolation
from tests.harness import SERVER_START
from tests.services.test_job_restarts import SMALL_FLEET

STRANGER = RunAs("stranger", 54321, 54321)  # no file here belongs to it


def test_the_mode_defaults_to_users_as_root_and_none_otherwise() -> None:
    assert os_users.choose_isolation(None, 0) is Isolation.USERS
    assert os_users.choose_isolation(None, 1000) is Isolation.NONE
    assert os_users.choose_isolation("none", 0) is Isolation.NONE
    assert os_users.choose_isolation("users", 0) is Isolation.USERS


def test_mode_users_without_root_and_an_unknown_mode_are_refused() -> None:
    with pytest.raises(StartRefused, match=r"'users' needs a server run as root.*--isolation none"):
        os_users.choose_isolation("users", 1000)
    with pytest.raises(StartRefused, match="'both': give 'users' or 'none'"):
        os_users.choose_isolation("both", 0)


def test_the_work_directory_defaults_beside_the_data_directory_or_to_the_store_s_own_under_var_lib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = "0123456789abcdef0123456789abcdef"
    base = work_root.default_base()
    assert work_root.default_root(tmp_path / "data", 1000, store, base) == tmp_path / "data-work"
    assert work_root.default_root(tmp_path / "data", 0, store, base) == base / store
    monkeypatch.delenv(work_root.BASE_VARIABLE, raising=False)
    assert work_root.default_base() == Path("/var/lib/hyperplan/work")
    monkeypatch.setenv(work_root.BASE_VARIABLE, str(tmp_path / "base"))
    assert work_root.default_base() == tmp_path / "base"


def test_a_work_directory_inside_the_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for inside in (data, data / "work", data / "a" / ".." / "b"):
        with pytest.raises(StartRefused, match="inside the data directory"):
            os_users.check_work_dir_place(inside, data)
    (tmp_path / "link").symlink_to(data)
    with pytest.raises(StartRefused, match="inside the data directory"):
        os_users.check_work_dir_place(tmp_path / "link" / "work", data)
    assert os_users.check_work_dir_place(tmp_path / "data-work", data) == (tmp_path / "data-work").resolve()


def test_the_work_directory_is_made_0711_and_refused_in_mode_users_where_others_cannot_pass(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    work = closed / "deep" / "work"
    os_users.make_work_dir(work, Isolation.NONE)
    assert stat.S_IMODE(work.stat().st_mode) == 0o711
    assert stat.S_IMODE(work.parent.stat().st_mode) == 0o711
    with pytest.raises(StartRefused, match=rf"accounts' users cannot reach it, for {closed}|no o\+x"):
        os_users.make_work_dir(work, Isolation.USERS)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may pass through (pytest's own are 0700 above the test's directory)."""
    path = Path(tempfile.mkdtemp(prefix="hp-open-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_interpreters_others_cannot_run_are_named(open_dir: Path, tmp_path: Path) -> None:
    private = open_dir / "python"
    private.write_text("#!/bin/sh\n")
    private.chmod(0o700)
    assert os_users.closed_to_others("/bin/sh") is None
    assert (
        os_users.closed_to_others(private) == f"{private}: other users may not read and run it (needs o+rx)"
    )
    hidden = tmp_path / "python"
    hidden.write_text("")
    hidden.chmod(0o755)
    assert "does not let other users pass (no o+x)" in str(os_users.closed_to_others(hidden))
    with pytest.raises(StartRefused, match=rf"\[images\] 'team/\*': {private}"):
        os_users.check_interpreters({"team/*": str(private)}, None)
    with pytest.raises(StartRefused, match=f"the default interpreter {private}"):
        os_users.check_interpreters({"ok": "/bin/sh"}, str(private))
    os_users.check_interpreters({"ok": "/bin/sh"}, None)


def test_a_program_the_accounts_user_cannot_read_is_named_with_the_reason(open_dir: Path) -> None:
    program = open_dir / "train.py"
    program.write_text("print('hi')\n")
    program.chmod(0o600)
    assert os_users.unreadable_by(program, STRANGER) == (
        f"{program}: the account's user stranger may not read it (Permission denied)"
    )
    program.chmod(0o644)
    assert os_users.unreadable_by(program, STRANGER) is None
    closed = open_dir / "closed"
    closed.mkdir(mode=0o700)
    hidden = closed / "train.py"
    hidden.write_text("")
    hidden.chmod(0o644)
    assert (
        os_users.unreadable_by(hidden, STRANGER)
        == f"{hidden}: the account's user stranger may not enter {closed}"
    )
    program.chmod(0o600)
    assert os_users.unreadable_by(program, RunAs("me", os.geteuid(), os.getegid())) is None  # its owner


def test_os_user_names_an_administrator_gives_are_checked() -> None:
    for bad in ("", "a\0b", "../x", "-rf", "x" * 40):
        with pytest.raises(ValidationError, match="OsUser"):
            os_users.check_named_user(bad)
    with pytest.raises(ValidationError, match="uid 0"):
        os_users.check_named_user("root")
    with pytest.raises(ValidationError, match="does not exist"):
        os_users.check_named_user("hp-no-such-user-here")


def test_a_start_closes_the_data_directory_to_everyone_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "old").mkdir(parents=True)
    os.chmod(data, 0o755)
    os.chmod(data / "old", 0o755)
    (data / "old" / "credentials").write_text("x")
    (data / "old" / "credentials").chmod(0o644)
    (data / "old" / "run.sh").write_text("x")
    (data / "old" / "run.sh").chmod(0o755)
    outside = tmp_path / "outside"
    outside.write_text("")
    outside.chmod(0o644)
    (data / "link").symlink_to(outside)
    application = Application(
        AppConfig(
            data_dir=data,
            fleet_path=SMALL_FLEET,
            clock="manual",
            clock_start=SERVER_START,
            backend=lambda _work_dir: FakeBackend(FakeWorld()),
            isolation="none",
            work_dir=tmp_path / "work",
        )
    )
    try:
        application.bootstrap()
        modes = {
            path.relative_to(data).as_posix(): stat.S_IMODE(path.lstat().st_mode)
            for path in [data, *data.rglob("*")]
            if not path.is_symlink()
        }
    finally:
        application.stop()
    assert modes.pop(".") == 0o700
    assert modes.pop("old") == 0o700
    assert modes.pop("old/run.sh") == 0o700  # the owner keeps what it had
    assert {"hyperplan.db", "credentials", "master.key", "old/credentials"} <= modes.keys()
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # a link is not followed
    assert stat.S_IMODE((tmp_path / "work").stat().st_mode) == 0o711
    close_data_dir(data)  # again: nothing to change, nothing fails


def test_serve_s_work_dir_wins_over_the_fleet_file_s(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET.read_text() + f'\n[backend]\nwork_dir = "{tmp_path / "from-fleet"}"\n')

    def work_dir(given: Path | None) -> Path:
        application = Application(
            AppConfig(
                data_dir=tmp_path / "data",
                fleet_path=fleet,
                clock="manual",
                clock_start=SERVER_START,
                backend=lambda _work_dir: FakeBackend(FakeWorld()),
                isolation="none",
                work_dir=given,
            )
        )
        try:
            return application.open().work_dir
        finally:
            application.stop()

    assert work_dir(None) == tmp_path / "from-fleet"
    assert work_dir(tmp_path / "from-flag") == tmp_path / "from-flag"
