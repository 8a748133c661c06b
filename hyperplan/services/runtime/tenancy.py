"""Whom an account's work runs as, and the work directory's passages: what the cluster provisioning and
the job launch ask before they hand work to the back end (isolation: services/accounts/os_users.py)."""

from __future__ import annotations

import os
from pathlib import Path

from hyperplan.backends.base import RunAs
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import os_users
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, Cluster

PASSAGE_MODE = 0o711  # traversable by the accounts' users, listable by none


class NoOsUser(ValueError):
    """In isolation mode `users`, the account's OS user is not known or does not exist."""


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
