"""Sign-in with an access key pair, and sign-out.

The sign-in form carries a CSRF token too, tied to an anonymous session (a cookie with a nonce and no
key), so that another site cannot sign a browser into an account of its choosing. A key pair is checked
against the store's live keys (the same lookup as SigV4); a success starts a new session with a new
nonce, recorded in the store (services/runtime/console_sessions.py), and ends the one it replaces. A wrong
pair is answered with the same words whether the key exists or not. Sign-out deletes the session's record,
so that its cookie, replayed, signs nobody in on any server sharing the store.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from hyperplan.console.forms import Form
from hyperplan.console.session import (
    ANONYMOUS_LIFETIME,
    COOKIE,
    LIFETIME,
    PATH,
    Identity,
    Session,
    SessionCodec,
)
from hyperplan.console.web import CSRF_FIELD, PREFIX, Console, Page, render, secret_matches, signed_in_caller
from hyperplan.services.runtime.context import ServiceContext

HOME = f"{PREFIX}/plans"
WRONG_PAIR = "This access key ID and secret access key are not a live key pair."


def _next(target: str) -> str:
    """Where to go after signing in: a console path only, never another site."""
    if target.startswith(PREFIX + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return HOME


def _with_cookie(response: Response, request: Request, codec: SessionCodec, session: Session) -> Response:
    response.set_cookie(
        COOKIE,
        codec.encode(session),
        max_age=LIFETIME if session.identity else ANONYMOUS_LIFETIME,
        path=PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


def sign_in_form(
    console: Console, codec: SessionCodec, runtime: ServiceContext, request: Request, body: bytes
) -> Response:
    session = codec.decode(request.cookies.get(COOKIE))
    if session is not None and signed_in_caller(runtime, session):
        return RedirectResponse(_next(request.query_params.get("next", "")), status_code=303)
    session = codec.new(None)
    page = Page("sign_in.html", {"values": {"next": request.query_params.get("next", "")}, "errors": {}})
    return _with_cookie(render(console, runtime, codec, session, None, page), request, codec, session)


def sign_in(
    console: Console, codec: SessionCodec, runtime: ServiceContext, request: Request, body: bytes
) -> Response:
    form = Form.parse(body)
    session = codec.decode(request.cookies.get(COOKIE))
    values = {"next": form.get("next"), "access_key_id": form.get("access_key_id").strip()}
    if not codec.csrf_ok(session, form.get(CSRF_FIELD)):
        # A session that exists is kept (a forged post must not sign anyone out); none: a new one.
        errors = {"": "The sign-in form was stale or came from another page; nothing was done. Try again."}
        page = Page("sign_in.html", {"values": values, "errors": errors}, status=403)
        if session is not None:
            return render(console, runtime, codec, session, None, page)
        fresh = codec.new(None)
        return _with_cookie(render(console, runtime, codec, fresh, None, page), request, codec, fresh)
    assert session is not None
    key_id, secret = values["access_key_id"], form.get("secret_access_key")
    errors = {}
    if not key_id:
        errors["access_key_id"] = "Access key ID is required."
    if not secret:
        errors["secret_access_key"] = "Secret access key is required."
    caller = secret_matches(runtime, key_id, secret) if not errors and len(key_id) <= 128 else None
    if caller is None:
        errors = errors or {"secret_access_key": WRONG_PAIR}
        page = Page("sign_in.html", {"values": values, "errors": errors}, status=400)
        return render(console, runtime, codec, session, None, page)
    if session.identity is not None:  # signed in again over a session: the old one ends
        runtime.console_sessions.end(runtime.db, session.nonce)
    signed_in = codec.new(Identity(key_id))
    runtime.console_sessions.open(runtime.db, signed_in.nonce, key_id, signed_in.expires_at)
    response = RedirectResponse(_next(values["next"]), status_code=303)
    return _with_cookie(response, request, codec, signed_in)


def sign_out(
    console: Console, codec: SessionCodec, runtime: ServiceContext, request: Request, body: bytes
) -> Response:
    session = codec.decode(request.cookies.get(COOKIE))
    if not codec.csrf_ok(session, Form.parse(body).get(CSRF_FIELD)):
        caller = signed_in_caller(runtime, session) if session else None
        message = (
            "This form's security token is missing or stale; you are still signed in. Reload and try again."
        )
        page = Page("error.html", {"message": message, "status": 403}, status=403)
        return render(console, runtime, codec, session, caller, page)
    assert session is not None  # its CSRF token matched
    if session.identity is not None:  # ended in the store: the cookie, kept or copied, signs nobody in
        runtime.console_sessions.end(runtime.db, session.nonce)
    response = RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="lax")
    return response
