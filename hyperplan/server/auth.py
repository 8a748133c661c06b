"""Who is calling: SigV4 against the store's access keys, freshness against the real wall clock.

Also which API demands what of a signature (``wire/sigv4.py`` always demands ``host``, ``x-amz-date``
and the real body hash). The SageMaker API picks its operation from ``X-Amz-Target``, so that header
must be signed. Neither API has a use for presigned URLs: no route is meant to be opened from a link.
"""

from __future__ import annotations

from starlette.requests import Request

from hyperplan.clock import utcnow
from hyperplan.errors import AccessDenied
from hyperplan.services import account_views
from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext
from hyperplan.wire import sigv4

SIGNING_SERVICE = "sagemaker"
NATIVE_PREFIX = "/api/"

SAGEMAKER_API = sigv4.SigningPolicy(
    api="The SageMaker API", headers_signed_when_sent=frozenset({"x-amz-target"})
)
NATIVE_API = sigv4.SigningPolicy(api="The native API")


def policy_for(path: str) -> sigv4.SigningPolicy:
    """The native API lives under /api/; anything else gets the SageMaker API's stricter policy."""
    return NATIVE_API if path.startswith(NATIVE_PREFIX) else SAGEMAKER_API


def authenticate(runtime: ServiceContext, request: Request, body: bytes) -> Caller:
    runtime.sync()  # keys revoked, capacity booked, the clock moved by another process: seen now
    found: dict[str, Caller] = {}

    def load(access_key_id: str) -> tuple[str, Caller] | None:
        return account_views.caller_for_key(runtime, access_key_id)

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
        signed,
        # The decoded path the router matches, so the policy follows the API that will serve the request.
        policy=policy_for(request.scope["path"]),
        lookup_secret=lookup_secret,
        region=runtime.region,
        service=SIGNING_SERVICE,
        now=utcnow(),
    )
    return found[access_key_id]


def require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise AccessDenied(f"Account {caller.account_name!r} is not an administrator.")
