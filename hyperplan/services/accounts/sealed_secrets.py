"""Secrets at rest: the start step that unlocks the store's secrets, and the rotation of the master key.

Access-key secrets, webhook signing secrets and registry passwords are stored sealed under the master key
(hyperplan/store/master_key.py). A store made before that holds them in plain text: its migration
(0006) marks them, and `unlock`, the step Application.open runs right after the migration, seals them
all in one transaction and compacts the file. The migration cannot do it itself: it has no key. Registry
passwords came later (revision 0023) and are sealed from the start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.errors import MasterKeyUnavailable
from hyperplan.store import settings
from hyperplan.store.db import Database
from hyperplan.store.master_key import SecretBox, new_key, readable_by_others
from hyperplan.store.schema import AccessKey, RegistryCredential, Webhook

log = logging.getLogger(__name__)

# What the store's check token seals: any known text does, it only proves which key sealed the store.
_CHECK_TEXT = "hyperplan master key check"


def unlock(db: Database, key_path: Path) -> SecretBox:
    """The box that opens this store's secrets, after sealing any still in plain text.

    A store that has sealed secrets needs the key file that sealed them: missing, unreadable or another
    one, the server refuses to start (MasterKeyUnavailable, saying what to do). A store that has none
    gets a new key file if there is none yet.
    """
    with db.read() as session:
        check = settings.get(session, settings.MASTER_KEY_CHECK)
    box = _open_key_file(key_path, store_is_sealed=check is not None)
    if check is not None and not box.opens(check):
        raise MasterKeyUnavailable(
            f"The master key file {key_path} does not open this store's secrets: they were sealed under "
            "another key. Name the right file with --key-file or HYPERPLAN_KEY_FILE."
        )
    if readable_by_others(key_path):
        log.warning("the master key file %s is readable by other users: make it mode 0600", key_path)
    sealed = _seal_plain_secrets(db, box)
    if sealed:
        db.compact()  # the plain text must not survive in a free page or in the write-ahead log
        log.info("sealed %d secrets that were stored in plain text under the master key", sealed)
    return box


def _open_key_file(path: Path, *, store_is_sealed: bool) -> SecretBox:
    if store_is_sealed or path.exists():
        try:
            return SecretBox.load(path)
        except MasterKeyUnavailable as exc:
            if not store_is_sealed:
                raise
            raise MasterKeyUnavailable(
                f"{exc.message} This store's secrets are sealed under its master key and the server "
                "cannot start without it: restore the key file from its backup, or name it with "
                "--key-file or HYPERPLAN_KEY_FILE."
            ) from None
    try:
        return SecretBox.create(path)
    except FileExistsError:  # another server sharing the store made it a moment ago
        return SecretBox.load(path)


def _seal_plain_secrets(db: Database, box: SecretBox) -> int:
    """Seal every secret still in plain text, and record the check token: one transaction."""
    with db.write() as session:
        if settings.get(session, settings.MASTER_KEY_CHECK) is None:
            settings.put(session, settings.MASTER_KEY_CHECK, box.seal(_CHECK_TEXT))
        sealed = 0
        for key in session.scalars(select(AccessKey).where(AccessKey.secret_sealed.is_(False))):
            key.secret_access_key, key.secret_sealed = box.seal(key.secret_access_key), True
            sealed += 1
        for hook in session.scalars(select(Webhook).where(Webhook.secret_sealed.is_(False))):
            hook.secret, hook.secret_sealed = box.seal(hook.secret), True
            sealed += 1
    return sealed


@dataclass(frozen=True)
class Rotation:
    access_keys: int
    webhooks: int
    registry_credentials: int


def rotate_master_key(db: Database, box: SecretBox) -> Rotation:
    """A new master key: every secret (revoked keys' and deleted webhooks' too) sealed again under it in
    one transaction, then the old key dropped from the file.

    The file lists the new key above the old one until the transaction has committed, so a crash at any
    step leaves a file that opens every secret the store holds.
    """
    with box.rotating:
        old_keys = box.keys
        keys = [new_key(), *old_keys]
        box.use_keys(keys)
        try:
            with db.write() as session:
                rotation = _reseal_all(session, box)
        except BaseException:
            box.use_keys(old_keys)  # nothing was committed: the old key seals again
            raise
        box.use_keys(keys[:1])
    _compact_after_rotation(db)
    log.info(
        "rotated the master key: %d access-key secrets, %d webhook secrets and %d registry passwords "
        "sealed again",
        rotation.access_keys,
        rotation.webhooks,
        rotation.registry_credentials,
    )
    return rotation


def _compact_after_rotation(db: Database) -> None:
    """Rewrite the file so that no free page or old log frame keeps a token of the old key (which a
    rotation is usually there to retire). The rotation has committed: a failure here is only logged."""
    try:
        db.compact()
    except Exception:
        log.warning("the master key was rotated, but the database file could not be compacted", exc_info=True)


def _reseal_all(session: Session, box: SecretBox) -> Rotation:
    check = settings.get(session, settings.MASTER_KEY_CHECK)
    settings.put(
        session, settings.MASTER_KEY_CHECK, box.reseal(check) if check is not None else box.seal(_CHECK_TEXT)
    )
    keys = list(session.scalars(select(AccessKey)))
    for key in keys:
        key.secret_access_key = _resealed(box, key.secret_access_key, key.secret_sealed)
        key.secret_sealed = True
    hooks = list(session.scalars(select(Webhook)))
    for hook in hooks:
        hook.secret = _resealed(box, hook.secret, hook.secret_sealed)
        hook.secret_sealed = True
    logins = list(session.scalars(select(RegistryCredential)))
    for login in logins:  # sealed from the start (revision 0023): never plain text
        login.password = box.reseal(login.password)
    return Rotation(len(keys), len(hooks), len(logins))


def _resealed(box: SecretBox, stored: str, sealed: bool) -> str:
    return box.reseal(stored) if sealed else box.seal(stored)


def open_secret(box: SecretBox, stored: str, sealed: bool) -> str:
    """A stored secret in plain text (a row the start step has not sealed yet is plain already)."""
    return box.open(stored) if sealed else stored
