"""The dev registry's login file: one ``USER:HASH`` line, the hash bcrypt's, the only kind the distribution
registry's ``htpasswd`` authentication accepts. The hash is the ``bcrypt`` package's (pyca), a
development dependency like the registry itself: imported only when a login is made.
"""

from __future__ import annotations

from hyperplan.containers.host_tools import Refused

COST = 5
MAX_PASSWORD_BYTES = 72  # bcrypt reads no further: a longer password would be cut without a word
PREFIX = "$2b$"


def check_login(username: str, password: str) -> None:
    """Refused, saying why, for a login the file cannot hold or bcrypt would change."""
    if not username or ":" in username or any(c.isspace() or not c.isprintable() for c in username):
        raise Refused(f"--login {username!r}: a user name is one word without ':'")
    if not password:
        raise Refused("the password is empty: give it on standard input, one line")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise Refused(f"the password is longer than {MAX_PASSWORD_BYTES} bytes, all bcrypt reads of it")
    if any(c in password for c in "\r\n\0"):
        raise Refused("the password must be one line")


def line(username: str, password: str) -> str:
    """The file's line for this login (a fresh salt each time), newline included."""
    check_login(username, password)
    return f"{username}:{bcrypt(password)}\n"


def bcrypt(password: str, cost: int = COST) -> str:
    """``$2b$COST$`` and the salt and hash, for a password of at most 72 bytes."""
    import bcrypt as pyca_bcrypt

    return str(pyca_bcrypt.hashpw(password.encode(), pyca_bcrypt.gensalt(rounds=cost, prefix=b"2b")).decode())


def matches(password: str, hashed: str) -> bool:
    """Whether ``password`` is the one ``hashed`` (a bcrypt hash of :func:`bcrypt`) was made from."""
    import bcrypt as pyca_bcrypt

    if not hashed.startswith(PREFIX):
        return False
    try:
        return bool(pyca_bcrypt.checkpw(password.encode(), hashed.encode()))
    except ValueError:
        return False


def parse(text: str) -> dict[str, str]:
    """``{user: hash}`` of a file's lines."""
    entries = (entry.partition(":") for entry in text.splitlines() if entry.strip())
    return {username: hashed for username, _, hashed in entries}
