"""What a deleted account leaves on the machines goes before its OS user does.

``accounts delete`` (and, after a crash in the middle of one, the next start) removes:

- the account's job trees (``WORK/jobs/<job id>``), whoever its user is;
- for a user the server made: every process of that user, every file it owns in the scratch directories
  of the machines its work ran on (the back end's ``clear_user``: ``/tmp``, ``/var/tmp``, ``/dev/shm``)
  and under the work directory (its nodes' homes and sandboxes among them), then the user and its group.

What the server keeps of the account's work stays: its records and the logs it serves live in the
back end's own files (the server's, never the user's), and models, checkpoints and failure files were
copied out when each job ended. A user an administrator named (``--os-user``) is someone else's to
manage: it keeps its processes and files, and only the job trees go.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from sqlalchemy import select

from hyperplan.backends import disks, scratch
from hyperplan.backends.base import BackendError
from hyperplan.errors import HyperplanError
from hyperplan.services.accounts import os_users
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, TrainingJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cleared:
    job_trees: int
    """Job trees removed."""
    files: int
    """Files, links and directories of the user's removed under the work directory."""
    user_removed: bool


def clear_deleted_account(runtime: ServiceContext, account_id: str) -> Cleared:
    """Remove what the deleted account ``account_id`` left (see the module docstring). Safe to run again
    (a start after a crash does): what is gone is not looked for twice."""
    with runtime.db.read() as session:
        account = session.get(Account, account_id)
        if account is None or account.deleted_at is None:
            raise ValueError(f"account {account_id} is not deleted")
        jobs = list(session.scalars(select(TrainingJob.id).where(TrainingJob.account_id == account_id)))
        made = account.os_user if account.os_user_made else None
    trees = _remove_job_trees(runtime, jobs)
    if made is None or not runtime.settings.isolated or not os_users.exists(made):
        return Cleared(trees, 0, False)
    run_as = os_users.run_as(made)
    if run_as.uid == 0 or run_as.uid == os.geteuid():
        log.error(
            "account %s: its OS user %s is root or the server's: nothing of it removed", account_id, made
        )
        return Cleared(trees, 0, False)
    try:
        runtime.backend.clear_user(run_as)
    except BackendError as error:  # the user stays, so that the next start tries again
        log.warning("account %s: its user %s's leftovers stay for now: %s", account_id, made, error)
        return Cleared(trees, 0, False)
    swept = scratch.remove_owned(run_as.uid, [str(runtime.work_dir)])
    try:
        os_users.remove_user(made)
    except HyperplanError as error:
        log.warning("account %s deleted, but its OS user %s stays: %s", account_id, made, error.message)
        return Cleared(trees, swept.removed, False)
    log.info(
        "account %s: removed its OS user %s, %d job trees and %d of its files under the work directory",
        account_id,
        made,
        trees,
        swept.removed,
    )
    return Cleared(trees, swept.removed, True)


def _remove_job_trees(runtime: ServiceContext, job_ids: list[int]) -> int:
    """Each job's tree under the work directory, whole (rmtree never follows a link the tenant left)."""
    removed = 0
    for job_id in job_ids:
        tree = runtime.work_dir / "jobs" / str(job_id)
        if os.path.lexists(tree):
            disks.release_under(tree)  # a disk still mounted there (backends/disks.py) first
            shutil.rmtree(tree, ignore_errors=True)
            removed += 1
    return removed


def pending(runtime: ServiceContext) -> list[str]:
    """Deleted accounts whose OS user the server made and that still exists: a deletion cut short (the
    server died between the commit and the user's removal). The start finishes each."""
    with runtime.db.read() as session:
        rows = session.execute(
            select(Account.id, Account.os_user).where(
                Account.deleted_at.is_not(None), Account.os_user_made.is_(True), Account.os_user.is_not(None)
            )
        ).all()
    return [account_id for account_id, user in rows if user is not None and os_users.exists(user)]
