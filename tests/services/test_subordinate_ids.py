"""Each account's containers get a block of host ids of their own, over real stores: distinct blocks to
two accounts, the same block again to one, never a deleted account's block to a new one, nor a block
another store on the machine gave, nor ids someone holds in /etc/subuid. As root: the account's OS user
holds its block in /etc/subuid and /etc/subgid, and the entries go with the user.

The stores' allocations here write a machine record in the test's directory and take blocks from a range
where nothing else hands out ids; the tests as root that go through tenancy.container_ids use the
fleet's default range and the machine's own record, as a server does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.app import AppConfig, Application
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.core.id_ranges import SUBORDINATE_BLOCK, IdRange, parse_subordinate_ids
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import accounts, os_ids, os_users
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views
from hyperplan.services.runtime import tenancy
from hyperplan.services.runtime.context import ServiceContext
from tests.harness import SERVER_START, made_os_users

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
RANGE = IdRange(2**29, 2**29 + 4 * SUBORDINATE_BLOCK - 1)  # four blocks, where no tool hands out ids
BLOCKS = [
    IdRange(RANGE.first + n * SUBORDINATE_BLOCK, RANGE.first + (n + 1) * SUBORDINATE_BLOCK - 1)
    for n in range(4)
]
OS_IDS = IdRange(1_500_000, 1_599_999)  # the users' uids here: away from the servers' default range
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="making OS users and writing /etc/subuid and /etc/subgid needs root"
)


def _application(
    data_dir: Path, work_dir: Path, isolation: str = "none", fleet: Path = SMALL_FLEET
) -> Application:
    return Application(
        AppConfig(
            data_dir=data_dir,
            fleet_path=fleet,
            clock="manual",
            clock_start=SERVER_START,
            backend=lambda _work_dir: FakeBackend(FakeWorld()),
            isolation=isolation,
            work_dir=work_dir,
        )
    )


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServiceContext]:
    """A store of this process (isolation mode none, nothing made on the machine)."""
    application = _application(tmp_path / "data", tmp_path / "work")
    try:
        application.bootstrap()
        yield application.context
    finally:
        application.stop()


def _new_account(runtime: ServiceContext, name: str) -> str:
    return account_views.create_account(runtime, name, is_admin=False, payment_mode=None).account_id


def _delete_account(runtime: ServiceContext, name: str) -> None:
    with runtime.db.read() as session:
        admin = next(a for a in accounts.list_accounts(session) if a.is_admin)
    account_views.delete_account(runtime, Caller(admin.id, admin.name, True, "key"), name)


def _allocate(runtime: ServiceContext, account_id: str, record: Path, id_range: IdRange = RANGE) -> IdRange:
    with runtime.db.write() as session:
        return os_ids.allocate_subordinate_block(session, account_id, id_range, runtime.clock.now(), record)


def _block_of(runtime: ServiceContext, account_id: str) -> IdRange | None:
    with runtime.db.read() as session:
        return os_ids.subordinate_block_of(session, account_id)


def test_two_accounts_get_distinct_blocks_and_each_keeps_its_own(
    runtime: ServiceContext, tmp_path: Path
) -> None:
    record = tmp_path / "given"
    ann, bob = _new_account(runtime, "ann"), _new_account(runtime, "bob")
    assert _block_of(runtime, ann) is None
    assert _allocate(runtime, ann, record) == BLOCKS[0]
    assert _allocate(runtime, bob, record) == BLOCKS[1]
    assert (_block_of(runtime, ann), _block_of(runtime, bob)) == (BLOCKS[0], BLOCKS[1])
    assert record.read_text() == f"{BLOCKS[0]}\n{BLOCKS[1]}\n"  # the machine's record, for other stores
    assert os_users.blocks_given_here(record) == BLOCKS[:2]


def test_a_deleted_accounts_block_is_never_handed_to_a_new_one(
    runtime: ServiceContext, tmp_path: Path
) -> None:
    record = tmp_path / "given"
    leaving = _new_account(runtime, "leaving")
    assert _allocate(runtime, leaving, record) == BLOCKS[0]
    _delete_account(runtime, "leaving")
    record.unlink()  # not even if the machine's record were lost: the store's rows stay
    arriving = _new_account(runtime, "arriving")
    assert _allocate(runtime, arriving, record) == BLOCKS[1]


def test_blocks_another_store_on_the_machine_gave_are_skipped(
    runtime: ServiceContext, tmp_path: Path
) -> None:
    record = tmp_path / "given"
    other = _application(tmp_path / "other-data", tmp_path / "other-work")
    try:
        other.bootstrap()
        theirs = _new_account(other.context, "theirs")
        assert _allocate(other.context, theirs, record) == BLOCKS[0]
    finally:
        other.stop()
    ours = _new_account(runtime, "ours")
    assert _allocate(runtime, ours, record) == BLOCKS[1]


def test_no_block_left_is_refused_naming_the_range(runtime: ServiceContext, tmp_path: Path) -> None:
    record = tmp_path / "given"
    one_block = BLOCKS[0]
    first, second = _new_account(runtime, "first"), _new_account(runtime, "second")
    _allocate(runtime, first, record, one_block)
    with pytest.raises(ValidationError, match=f"subordinate_ids range {one_block}"):
        _allocate(runtime, second, record, one_block)
    assert _block_of(runtime, second) is None


def test_containers_ids_need_isolation_mode_users(runtime: ServiceContext) -> None:
    account = _new_account(runtime, "plain")
    with pytest.raises(tenancy.NoContainerIds, match="needs isolation mode 'users'"):
        tenancy.container_ids(runtime, account)
    assert _block_of(runtime, account) is None


# -- as root: /etc/subuid and /etc/subgid ---------------------------------------------------------------


def _entries(user: str) -> dict[str, list[IdRange]]:
    return {
        path.name: [held for owner, held in parse_subordinate_ids(path.read_text()) if owner == user]
        for path in os_users.SUBORDINATE_FILES
    }


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[ServiceContext]:
    """A store in isolation mode users, its work directory where accounts' users can pass. Every user it
    made goes with the test, whatever happens."""
    open_dir = Path(tempfile.mkdtemp(prefix="hp-subids-"))
    open_dir.chmod(0o711)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET.read_text() + f'\n[accounts]\nos_ids = "{OS_IDS}"\n')
    application = _application(tmp_path / "data", open_dir / "work", isolation="users", fleet=fleet)
    try:
        application.bootstrap()
        yield application.context
    finally:
        application.stop()
        made = made_os_users(tmp_path / "data")
        for user in made:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
        shutil.rmtree(open_dir, ignore_errors=True)
        assert not [user for user in made if os_users.exists(user)]


@needs_root
def test_the_accounts_user_holds_its_block_in_subuid_and_subgid_until_it_goes(
    isolated: ServiceContext,
) -> None:
    runtime = isolated
    ann, bob = _new_account(runtime, "ann"), _new_account(runtime, "bob")
    ann_ids = tenancy.container_ids(runtime, ann)
    assert ann_ids.size == SUBORDINATE_BLOCK and ann_ids.host_first in runtime.fleet.subordinate_ids
    assert tenancy.container_ids(runtime, ann) == ann_ids  # the same block again
    bob_ids = tenancy.container_ids(runtime, bob)
    assert bob_ids != ann_ids and bob_ids.host_first > ann_ids.host_first
    ann_block = IdRange(ann_ids.host_first, ann_ids.host_first + ann_ids.size - 1)
    assert ann_block in os_users.blocks_given_here()  # the machine's own record
    ann_user = os_users.user_name_for(ann)
    assert _entries(ann_user) == {"subuid": [ann_block], "subgid": [ann_block]}

    # Removed by hand (say, by an administrator tidying up): given back at the next use.
    subprocess.run(
        ["usermod", "--del-subuids", str(ann_block), "--del-subgids", str(ann_block), ann_user],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert tenancy.container_ids(runtime, ann) == ann_ids
    assert _entries(ann_user) == {"subuid": [ann_block], "subgid": [ann_block]}

    _delete_account(runtime, "ann")
    assert not os_users.exists(ann_user)
    assert _entries(ann_user) == {"subuid": [], "subgid": []}  # userdel takes them with the user
    assert tenancy.container_ids(runtime, bob) == bob_ids
    assert tenancy.container_ids(runtime, _new_account(runtime, "cid")).host_first > bob_ids.host_first


@needs_root
def test_a_block_someone_holds_in_subuid_is_skipped(runtime: ServiceContext, tmp_path: Path) -> None:
    holder = f"hpsub-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", holder],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        held = IdRange(RANGE.first + 100, RANGE.first + 199)
        subprocess.run(["usermod", "--add-subuids", str(held), holder], check=True, timeout=60)
        account = _new_account(runtime, "skips")
        block = _allocate(runtime, account, tmp_path / "given")
        assert block == IdRange(held.last + 1, held.last + SUBORDINATE_BLOCK)  # right above what is held
    finally:
        subprocess.run(["userdel", holder], capture_output=True, check=False, timeout=60)
    assert not os_users.exists(holder)


@needs_root
def test_an_accounts_user_never_gets_a_uid_inside_ids_someone_holds_for_containers(
    isolated: ServiceContext,
) -> None:
    """Such a user would own every file a container mapped there writes."""
    runtime = isolated
    coming = max([OS_IDS.first - 1, *(v for v in os_users.ids_given_here() if v in OS_IDS)]) + 1
    holder = f"hpsub-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", holder],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        held = IdRange(coming, coming + 9)
        subprocess.run(["usermod", "--add-subgids", str(held), holder], check=True, timeout=60)
        account = _new_account(runtime, "above")
        assert os_users.run_as(os_users.user_name_for(account)).uid == held.last + 1
    finally:
        subprocess.run(["userdel", holder], capture_output=True, check=False, timeout=60)
    assert not os_users.exists(holder)
