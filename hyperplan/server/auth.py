"""Who is calling: SigV4 against the store's access keys, freshness against the real wall clock."""

from __future__ import annotations

from starlette.requests import Request

from hyperplan.clock import utcnow
from hyperplan.errors import AccessDenied
from hyperplan.runtime import Runtime
from hyperplan.services import accounts
from hyperplan.services.accounts import Caller
from hyperplan.wire import sigv4

SIGNING_SERVICE = "sagemaker"


def authenticate(runtime: Runtime, request: Request, body: bytes) -> Caller:
    found: dict[str, Caller] = {}

    def load(access_key_id: str) -> tuple[str, Caller] | None:
        with runtime.db.read() as session:
            return accounts.caller_for_key(session, access_key_id)

    def lookup_secret(access_key_id: str) -> str | None:
        entry = runtime.keys.get(access_key_id, load)
        if entry is None:
            return None
        secret, caller = entry
        found[access_key_id] = caller
        return secret

    signed = sigv4.SignedRequest(
        method=request.method,
        path=request.scope.get("raw_path", request.url.path.encode()).decode("latin-1").split("?")[0],
        query=request.url.query,
        # A header sent twice is signed as its values joined by ',' (SigV4's canonical form).
        headers={key: ",".join(request.headers.getlist(key)) for key in request.headers},
        body=body,
    )
    access_key_id = sigv4.verify(
        signed, lookup_secret=lookup_secret, region=runtime.region, service=SIGNING_SERVICE, now=utcnow()
    )
    return found[access_key_id]


def require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise AccessDenied(f"Account {caller.account_name!r} is not an administrator.")
