"""The console's one way in: session, CSRF, authentication, rate limit, then the page's handler.

Every console route is a :class:`ConsoleRoute`. Before its handler runs, the request's session cookie is
read, its access key looked up through the same key cache the SigV4 path uses (a revoked key signs
nobody in) and the session found still open in the store (services/runtime/console_sessions.py: not signed
out, not idle too long); a POST must carry the form's CSRF token; the caller takes a token from the same
rate limiter as the APIs (``services/runtime/rate_limiter.py``: a read for a page, the route's class for an
action); an administrators' route refuses others. The handler runs off the event loop with the caller
and calls the same services as the API; what it returns (a page, a redirect, a JSON answer) is written
here, and so is every error: a refusal from the error tree as a page that says it, with its status; a
bug as a 500 that says so (logged with its traceback), never its text.
"""

from __future__ import annotations

import hmac
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from hyperplan.console.forms import FieldErrors, Form
from hyperplan.console.lengths import duration
from hyperplan.console.session import COOKIE, Identity, Session, SessionCodec
from hyperplan.core.rate_limits import RequestClass
from hyperplan.errors import AccessDenied, AuthError, HyperplanError, ResourceNotFound, Throttling
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views, console_views
from hyperplan.services.orchestration import clock as service_clock
from hyperplan.services.runtime.context import ServiceContext

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PREFIX = "/console"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class Page:
    template: str
    context: Mapping[str, Any] = field(default_factory=dict)
    status: int = 200


@dataclass(frozen=True)
class Redirect:
    to: str  # a path under the console


@dataclass(frozen=True)
class ConsoleRequest:
    runtime: ServiceContext
    caller: Caller
    form: Form
    query: Mapping[str, str]
    path: Mapping[str, str]

    @property
    def now(self) -> datetime:
        return self.runtime.clock.now()


Handler = Callable[[ConsoleRequest], Page | Redirect | Response]


if TYPE_CHECKING:
    import jinja2


class Console:
    """What every console route shares: the templates and the session codec (its key read from the
    store on first use). The templates, and Jinja with them, are loaded by the first page shown, not at
    every server start."""

    def __init__(self) -> None:
        self._templates: jinja2.Environment | None = None
        self._codec: SessionCodec | None = None
        self._lock = threading.Lock()

    @property
    def templates(self) -> jinja2.Environment:
        with self._lock:
            if self._templates is None:
                self._templates = _environment()
            return self._templates

    def codec(self, runtime: ServiceContext) -> SessionCodec:
        with self._lock:
            if self._codec is None:
                self._codec = SessionCodec(console_views.session_key(runtime))
            return self._codec

    def render(self, page: Page, **common: Any) -> HTMLResponse:
        text = self.templates.get_template(page.template).render(**common, **page.context)
        return HTMLResponse(text, status_code=page.status, headers=SECURITY_HEADERS)


def _environment() -> jinja2.Environment:
    import jinja2

    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.filters.update(when=when, money=money, price=price, day=day, duration=duration)
    templates.filters.update(attributes=attributes, iso=iso, utc_minute=utc_minute, scale=scale)
    templates.globals.update(url=url, clock_hints=CLOCK_HINTS)
    return templates


SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def caller_of(runtime: ServiceContext, identity: Identity) -> Caller | None:
    """Who the session's key signs in now; None once the key is revoked (or its account deleted)."""
    runtime.sync()
    entry = runtime.keys.get(identity.access_key_id, lambda key: account_views.caller_for_key(runtime, key))
    return None if entry is None else entry[1]


def signed_in_caller(runtime: ServiceContext, session: Session) -> Caller | None:
    """Who a session signs in now: None before sign-in, once its key no longer signs, and once the
    session has ended (signed out on any server, idle too long, or past its lifetime)."""
    identity = session.identity
    if identity is None:
        return None
    caller = caller_of(runtime, identity)  # after the change counters' read, which the next check uses
    if caller is None:
        return None
    if not runtime.console_sessions.is_open(
        runtime.db, session.nonce, identity.access_key_id, runtime.shared
    ):
        return None
    return caller


def secret_matches(runtime: ServiceContext, access_key_id: str, secret: str) -> Caller | None:
    """The caller of a key pair whose secret is `secret` (compared in constant time), else None."""
    runtime.sync()
    entry = runtime.keys.get(access_key_id, lambda key: account_views.caller_for_key(runtime, key))
    if entry is None or not hmac.compare_digest(entry[0].encode(), secret.encode()):
        return None
    return entry[1]


class ConsoleRoute(Route):
    """A console page or action. `request_class`: the rate limit class of a POST (a page is a read);
    `admin`: administrators only; `public`: served without a session (sign-in)."""

    def __init__(
        self,
        method: str,
        path: str,
        handler: Callable[..., Any],
        console: Console,
        *,
        request_class: RequestClass | None = None,
        admin: bool = False,
        public: bool = False,
    ) -> None:
        self.handler = handler
        self.admin = admin
        self.public = public
        if method == "GET":
            request_class = RequestClass.READ
        self.request_class = request_class or RequestClass.WRITE
        endpoint = _public_endpoint(handler, console) if public else _endpoint(self, console)
        super().__init__(PREFIX + path, endpoint, methods=[method])


def _endpoint(route: ConsoleRoute, console: Console) -> Callable[[Request], Any]:
    async def serve(request: Request) -> Response:
        runtime: ServiceContext = request.app.state.runtime
        codec = await run_in_threadpool(console.codec, runtime)
        session = codec.decode(request.cookies.get(COOKIE))
        caller = None
        if session is not None and session.identity is not None:
            caller = await run_in_threadpool(signed_in_caller, runtime, session)
            if caller is not None and request.client is not None:  # from where, for the audit trail
                caller = replace(caller, remote_address=request.client.host)
        if session is None or caller is None:
            if request.method == "GET":
                return RedirectResponse(f"{PREFIX}/sign-in?next={quote(request.url.path)}", status_code=303)
            ended = "Your session has ended: sign in again."
            return _refusal(console, runtime, codec, session, None, 401, ended)
        form = Form.parse(await request.body()) if request.method == "POST" else Form([])
        if request.method == "POST" and not codec.csrf_ok(session, form.get(CSRF_FIELD)):
            return _refusal(
                console, runtime, codec, session, caller, 403,
                "This form's security token is missing or stale (the form came from another page or an "
                "earlier session). Nothing was changed; reload the page and try again.",
            )  # fmt: skip
        console_request = ConsoleRequest(
            runtime, caller, form, dict(request.query_params), dict(request.path_params)
        )
        try:
            runtime.rate_limiter.admit(caller, route.request_class, runtime.fleet.rate_limits)
            if route.admin and not caller.is_admin:
                raise AccessDenied(
                    f"Only administrators see this page; account {caller.account_name!r} is not one."
                )
            result = await run_in_threadpool(route.handler, console_request)
        except Exception as exc:
            return _error_page(console, runtime, codec, session, caller, exc)
        return _respond(console, runtime, codec, session, caller, result)

    return serve


def _public_endpoint(handler: Callable[..., Any], console: Console) -> Callable[[Request], Any]:
    """Sign-in and sign-out: they make or end the session themselves."""

    async def serve(request: Request) -> Response:
        runtime: ServiceContext = request.app.state.runtime
        codec = await run_in_threadpool(console.codec, runtime)
        try:
            result: Response = await run_in_threadpool(
                handler, console, codec, runtime, request, await request.body()
            )
        except Exception as exc:
            return _error_page(console, runtime, codec, None, None, exc)
        return result

    return serve


def _respond(
    console: Console,
    runtime: ServiceContext,
    codec: SessionCodec,
    session: Session,
    caller: Caller,
    result: Page | Redirect | Response,
) -> Response:
    if isinstance(result, Redirect):
        return RedirectResponse(PREFIX + result.to, status_code=303)
    if isinstance(result, Page):
        return render(console, runtime, codec, session, caller, result)
    return result


def render(
    console: Console,
    runtime: ServiceContext,
    codec: SessionCodec,
    session: Session | None,
    caller: Caller | None,
    page: Page,
) -> HTMLResponse:
    return console.render(
        page,
        caller=caller,
        csrf_field=CSRF_FIELD,
        csrf=codec.csrf_token(session) if session else "",
        service_clock=service_clock.show(runtime),  # in every page's header: whose time the page shows
    )


STATUS = (
    (ResourceNotFound, 404),
    (AuthError, 403),
    (Throttling, 429),
)


def _error_page(
    console: Console,
    runtime: ServiceContext,
    codec: SessionCodec,
    session: Session | None,
    caller: Caller | None,
    exc: Exception,
) -> Response:
    if isinstance(exc, FieldErrors):  # a handler that did not show its own form's errors
        return _refusal(console, runtime, codec, session, caller, 400, "; ".join(exc.errors.values()))
    if not isinstance(exc, HyperplanError):
        request_id = str(uuid.uuid4())
        log.exception("console request %s failed with a bug", request_id, exc_info=exc)
        message = f"Internal error (request {request_id}); the server log has the details."
        return _refusal(console, runtime, codec, session, caller, 500, message)
    status = next((code for kind, code in STATUS if isinstance(exc, kind)), exc.status)
    if isinstance(exc, Throttling):
        message = f"Too many requests: {exc.message} Nothing was changed."
    else:
        message = exc.message
    return _refusal(console, runtime, codec, session, caller, status, message)


def _refusal(
    console: Console,
    runtime: ServiceContext,
    codec: SessionCodec,
    session: Session | None,
    caller: Caller | None,
    status: int,
    message: str,
) -> Response:
    page = Page("error.html", {"message": message, "status": status}, status=status)
    return render(console, runtime, codec, session, caller, page)


# -- what templates use ------------------------------------------------------------------------------


def url(path: str, *parts: str) -> str:
    """A console URL: a path under /console with each part quoted as one path segment."""
    return PREFIX + path + "".join("/" + quote(str(part), safe="") for part in parts)


CLOCK_HINTS = {
    "wall": "The service's time is the real time.",
    "manual": "The service's time moves only when an administrator advances or sets it "
    "(hyperplan clock advance, hyperplan clock set).",
    "accelerated": "The service's time runs faster than the real time, from where it was started or last "
    "moved to.",
}


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def utc_minute(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def scale(factor: float) -> str:
    """A time scale without a needless ".0": 40000, 1.5."""
    return str(int(factor)) if factor == int(factor) else str(factor)


def when(moment: datetime | None) -> Markup:
    """A moment in UTC, which the page's script also shows in the browser's zone."""
    if moment is None:
        return Markup("&mdash;")
    return Markup('<time datetime="{}">{}</time>').format(iso(moment), utc_minute(moment))


def attributes(values: Mapping[str, object]) -> Markup:
    """An element's attributes from a mapping, each value escaped once: True is an attribute without a
    value (required), False and None leave it out. Written as text in a template, an attribute would be
    escaped as a whole (min=&#34;1&#34;), and the browser would not see it."""
    found = []
    for name, value in values.items():
        if value is True:
            found.append(Markup(" {}").format(name))
        elif value is not None and value is not False:
            found.append(Markup(' {}="{}"').format(name, value))
    return Markup("").join(found)


def day(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%a %d %b")


def price(amount: Decimal, currency: str = "") -> str:
    """A price as the fleet file gives it (55.04, 2.765): never rounded, at least two places."""
    places = max(-amount.normalize().as_tuple().exponent, 2)  # type: ignore[operator]
    return f"{amount:,.{places}f} {currency}".strip()


def money(amount: Decimal | None, currency: str = "") -> str:
    if amount is None:
        return "—"
    return f"{amount:,.2f} {currency}".strip()
