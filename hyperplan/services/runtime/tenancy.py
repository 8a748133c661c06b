"""Whom an account's work runs as, its containers' ids, and the work directory's passages: what the cluster
provisioning and the job launch ask before they hand work to the back end (isolation:
services/accounts/os_users.py; the ids: services/accounts/os_ids.py)."""

from __future__ import annotations

import os
from pathlib import Path

from hyperplan.backends.base import IdMap, RunAs
from hyperplan.core.id_ranges import IdRange
from hyperplan.errors import InternalFailure, ValidationError
from hyperplan.services.accounts import os_ids, os_users
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, Cluster

PASSAGE_MODE = 0o711  # traversable by the accounts' users, listable by none


class NoOsUser(ValueError):
    """In isolation mode `users`, the account's OS user is not known or does not exist."""


class NoContainerIds(ValueError):
    """The account's containers can have no ids of their own: isolation mode `none`, no block left in the
    fleet's range, or its OS user could not be given it."""


def run_as(runtime: ServiceContext, account_id: str) -> RunAs | None:
    """The account's OS user now (pwd), for its nodes and job instances; None in isolation mode `none`
    (the server's own user)."""
    if not runtime.settings.isolated:
        return None
    with runtime.db.read() as session:
        account = session.get(Account, account_id)
        user = account.os_user if account is not None else None
    if user is None:
        raise NoOsUser(f"account {account_id} has no OS user yet (restart the server in mode users)")
    try:
        return os_users.run_as(user)
    except ValidationError as error:
        raise NoOsUser(f"account {account_id}: {error.message}") from None


def cluster_run_as(runtime: ServiceContext, cluster_id: int) -> RunAs | None:
    if not runtime.settings.isolated:
        return None
    with runtime.db.read() as session:
        cluster = session.get(Cluster, cluster_id)
        account_id = cluster.account_id if cluster is not None else ""
    return run_as(runtime, account_id)


def container_ids(runtime: ServiceContext, account_id: str) -> IdMap:
    """The user namespace of the account's containers: its own block of host ids (root inside is the
    block's first id, which is nobody on the host), handed out on first use and never to another account,
    and held in /etc/subuid and /etc/subgid by the account's OS user when the server made it (a user an
    administrator named is theirs to manage, as account_files.py says)."""
    if not runtime.settings.isolated:
        raise NoContainerIds(
            "containers run in a user namespace of the account's own ids, which needs isolation mode "
            "'users' (a server run as root)"
        )
    owner = run_as(runtime, account_id)
    assert owner is not None  # isolated
    with runtime.db.read() as session:
        block = os_ids.subordinate_block_of(session, account_id)
        account = session.get(Account, account_id)
        made = account is not None and account.os_user_made
    if block is None:
        block = _hand_out_block(runtime, account_id)
    if made and not os_users.holds_subordinate_ids(owner.user, block):
        try:
            with os_users.making_users():
                os_users.give_subordinate_ids(owner.user, block)
        except InternalFailure as error:
            raise NoContainerIds(f"account {account_id}: {error.message}") from None
    return IdMap(block.first, block.size)


def cluster_container_ids(runtime: ServiceContext, cluster_id: int) -> IdMap:
    """:func:`container_ids` of the cluster's account, for its nodes."""
    with runtime.db.read() as session:
        cluster = session.get(Cluster, cluster_id)
        account_id = cluster.account_id if cluster is not None else ""
    return container_ids(runtime, account_id)


def _hand_out_block(runtime: ServiceContext, account_id: str) -> IdRange:
    # The write first, then the machine's lock, in the order account_views takes them for users; and a
    # second look inside, where another request or server may have handed the account its block meanwhile.
    with runtime.db.write() as session, os_users.making_users():
        block = os_ids.subordinate_block_of(session, account_id)
        if block is not None:
            return block
        try:
            return os_ids.allocate_subordinate_block(
                session, account_id, runtime.fleet.subordinate_ids, runtime.clock.now()
            )
        except ValidationError as error:
            raise NoContainerIds(error.message) from None


def open_passage(work_dir: Path, directory: Path) -> None:
    """Make ``directory`` (below the work directory) and every directory between, each 0711 and the
    server's: an account's user passes through to its own tree below, and lists nothing."""
    relative = directory.relative_to(work_dir)
    current = work_dir
    for part in relative.parts:
        current = current / part
        current.mkdir(exist_ok=True)
        os.chmod(current, PASSAGE_MODE)


def unreadable_program(argv: tuple[str, ...], interpreter: str | None, owner: RunAs | None) -> str | None:
    """Why the account's user cannot read the program a job names (its absolute first word, or the
    script its interpreter runs), or None."""
    if owner is None or not argv:
        return None
    programs = [argv[0]]
    runs_a_script = len(argv) > 1 and (
        argv[0] == interpreter or Path(argv[0]).name.startswith(("python", "sh", "bash"))
    )
    if runs_a_script:
        programs.append(argv[1])
    for program in programs:
        if program.startswith("/"):
            why = os_users.unreadable_by(program, owner)
            if why is not None:
                return why
    return None
