"""Console sessions: a signed cookie, its CSRF token, and who it signs in.

The cookie holds a random nonce, the access key id it was signed in with (none before sign-in) and when
it expires, signed with HMAC-SHA256 under the key the store keeps
(``services/orchestration/console_views.session_key``), so that every server sharing the store accepts
it. It holds no secret and no account: each request finds the key's account through the same key cache
the SigV4 path uses, so a revoked key ends its sessions at once (within the cache's few seconds for a
revocation made by another server).

A valid signature is not enough: a signed-in session is also recorded in the store at sign-in
(services/runtime/console_sessions.py), and honoured only while that record exists and the session has not
been idle past the server's idle timeout. Sign-out deletes the record, so a copy of the cookie signs nobody
in afterwards, on any server sharing the store.

The CSRF token of a form is the HMAC of the session's nonce: a page of another site can neither read it
nor make it. Signing in issues a fresh nonce, so a token learnt before sign-in is worthless after.
Expiry is real wall time, never the service clock (a manual clock standing still must not keep a
session alive for ever).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "hyperplan_console"
PATH = "/console"
LIFETIME = 12 * 3600  # seconds a session lasts from sign-in
ANONYMOUS_LIFETIME = 3600  # a sign-in form's session, before anyone signed in


@dataclass(frozen=True)
class Identity:
    """Who a session signs in: the access key id (a user, when accounts have users, joins it here)."""

    access_key_id: str


@dataclass(frozen=True)
class Session:
    nonce: str
    expires_at: int  # seconds since the epoch
    identity: Identity | None  # None: not signed in


class SessionCodec:
    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock

    def new(self, identity: Identity | None) -> Session:
        lifetime = LIFETIME if identity else ANONYMOUS_LIFETIME
        return Session(secrets.token_urlsafe(18), int(self._clock()) + lifetime, identity)

    def encode(self, session: Session) -> str:
        payload = {"n": session.nonce, "e": session.expires_at}
        if session.identity is not None:
            payload["k"] = session.identity.access_key_id
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{body}.{_b64(self._mac(b'session:' + body.encode()))}"

    def decode(self, cookie: str | None) -> Session | None:
        """The session a cookie carries; None when it is missing, forged, malformed or expired."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 1024:
            return None
        body, mac = cookie.split(".")
        if not hmac.compare_digest(_b64(self._mac(b"session:" + body.encode())), mac):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            nonce, expires, key = str(payload["n"]), int(payload["e"]), payload.get("k")
        except (ValueError, KeyError, TypeError):
            return None
        if expires <= self._clock():
            return None
        return Session(nonce, expires, Identity(str(key)) if key else None)

    def csrf_token(self, session: Session) -> str:
        return _b64(self._mac(b"csrf:" + session.nonce.encode()))

    def csrf_ok(self, session: Session | None, token: str | None) -> bool:
        if session is None or not token:
            return False
        return hmac.compare_digest(self.csrf_token(session), token)

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
