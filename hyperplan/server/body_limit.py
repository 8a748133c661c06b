"""The request body, read once for every route: capped, and given a deadline, before anything else runs.

Every route (both APIs, /healthz, and the 404s and 405s of no route) sees its body through this
middleware. A body is read here in chunks, up to the cap and until the deadline, and only a complete
body is handed on, so no handler can be made to hold more than the cap or wait on a stalled client.
Authentication comes after: an unsigned request costs the server at most the cap.

Refusals are answered in the shape of the API the path belongs to (server/errors.py), with
`Connection: close`, since the rest of the body is never read: uvicorn closes the connection after the
answer instead of reading on to find the next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyperplan.errors import ProtocolError, RequestTimeout, RequestTooLarge
from hyperplan.server.errors import error_response_for_path
from hyperplan.server.limits import ServerLimits, describe_bytes
from hyperplan.server.request_ids import new_request_id


class BodyLimit:
    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared, chunked = _framing(scope) if scope["type"] == "http" else (None, False)
        if not (declared or chunked):  # no body (h11 has no close-delimited request bodies)
            await self.app(scope, receive, send)
            return
        body = await capped_body(scope, receive, send, self.limits)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)


async def capped_body(scope: Scope, receive: Receive, send: Send, limits: ServerLimits) -> bytes | None:
    """The request's whole body, read under the cap and the deadline; None when it was refused (the
    refusal is sent, in the shape of the path's API). What BodyLimit does for every route, and the
    awsJson front door (server/routing.py) for POST / itself."""
    declared, chunked = _framing(scope)
    if not (declared or chunked):
        return b""
    try:
        return await _read_body(limits, declared, receive)
    except ProtocolError as refusal:
        await _refuse(scope, send, refusal)
        return None


async def _read_body(limits: ServerLimits, declared: int | None, receive: Receive) -> bytes:
    cap = limits.max_body_bytes
    if declared is not None and declared > cap:
        raise RequestTooLarge(
            f"The request body ({declared} bytes) is over this server's limit of {describe_bytes(cap)}."
        )
    deadline = asyncio.get_running_loop().time() + limits.body_timeout
    # Most bodies arrive with their headers: the first receive then returns without waiting, and a whole
    # body needs no deadline (a timer scheduled and cancelled on the loop, a noticeable share of a
    # search's CPU). So the first receive is started here, and only if it must wait, or more of the body
    # is to come, does the rest of the read run under the deadline.
    first = receive()
    if asyncio.iscoroutine(first):
        try:
            waiting = first.send(None)
        except StopIteration as arrived:
            message = arrived.value
            if message["type"] == "http.request" and not message.get("more_body", False):
                return _within(cap, 0, message.get("body", b""))
            rest: Awaitable[bytes] = _read_up_to(receive, cap, message)
        else:
            rest = _read_up_to(receive, cap, await_rest=_Resumed(first, waiting))
    else:
        rest = _read_up_to(receive, cap, await_rest=first)
    try:
        async with asyncio.timeout_at(deadline):
            return await rest
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {limits.body_timeout:g} s of its headers."
        ) from None


async def _read_up_to(
    receive: Receive, cap: int, message: Message | None = None, await_rest: Awaitable[Message] | None = None
) -> bytes:
    """The body, from its first message (`message`, or what `await_rest` gives: the first receive,
    already started) on."""
    if message is None:
        message = await (await_rest if await_rest is not None else receive())
    if message["type"] == "http.request" and not message.get("more_body", False):
        return _within(cap, 0, message.get("body", b""))  # the whole body in one message: no copy
    body = bytearray()
    while True:
        if message["type"] != "http.request":  # http.disconnect: nobody is left to answer
            raise RequestTimeout("The connection closed before the request body was complete.")
        body += _within(cap, len(body), message.get("body", b""))
        if not message.get("more_body", False):
            return bytes(body)
        message = await receive()


class _Resumed:
    """A coroutine that was started by hand (``send(None)``) and stopped at its first wait, finished by
    whoever awaits this: each wait it yields goes to the awaiting task, and what the task sends or
    throws back (a cancellation, when the deadline passes) goes into the coroutine, as ``await`` does."""

    def __init__(self, coroutine: Coroutine[Any, Any, Message], waiting: Any) -> None:
        self.coroutine = coroutine
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, Message]:
        coroutine, waiting = self.coroutine, self.waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as thrown:
                try:
                    waiting = coroutine.throw(thrown)
                except StopIteration as done:
                    return cast(Message, done.value)
            else:
                try:
                    waiting = coroutine.send(sent)
                except StopIteration as done:
                    return cast(Message, done.value)


def _within(cap: int, so_far: int, chunk: bytes) -> bytes:
    if so_far + len(chunk) > cap:
        raise RequestTooLarge(f"The request body is over this server's limit of {describe_bytes(cap)}.")
    return chunk


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The request's Content-Length, if any, and whether its body is chunked, in one pass."""
    declared, chunked = None, False
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = int(value)  # h11 has already refused a malformed one
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the connection's own messages (a later http.disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse(scope: Scope, send: Send, refusal: ProtocolError) -> None:
    response = error_response_for_path(scope["path"], refusal, new_request_id())
    response.headers["connection"] = "close"

    async def no_body() -> Message:  # a refusal never reads the request
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)
