"""A response's head goes out with its body in one write (server/one_write.py), driven by uvicorn's own
request-response cycle; what is not a fixed-length response's head goes straight through."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from hyperplan.server.one_write import HeadWithBody


class Socket(asyncio.Transport):
    """The bytes each write handed to the kernel, one entry a write, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data:  # as asyncio's socket transport: an empty write sends nothing
            self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _cycle(method: str = "POST", expect_100_continue: bool = False) -> tuple[RequestResponseCycle, Socket]:
    socket = Socket()
    scope: Any = {"type": "http", "method": method, "path": "/", "query_string": b"", "headers": []}
    cycle = RequestResponseCycle(
        scope=scope,
        transport=socket,
        flow=FlowControl(socket),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=expect_100_continue,
        keep_alive=True,
        on_response=lambda: None,
    )
    cycle.transport = cast(asyncio.Transport, HeadWithBody(socket, cycle))  # as header_deadline.py does
    return cycle, socket


async def _send(cycle: RequestResponseCycle, message: dict[str, Any]) -> None:
    await cycle.send(cast(Any, message))


def _start(length: int | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/x-amz-json-1.1")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


def test_a_fixed_length_answer_is_one_write_with_its_head_first() -> None:
    async def answer() -> Socket:
        cycle, socket = _cycle()
        await _send(cycle, _start(7))
        assert socket.writes == []  # held for the body
        await _send(cycle, {"type": "http.response.body", "body": b'{"a":1}'})
        return socket

    socket = asyncio.run(answer())
    assert len(socket.writes) == 1
    head, _, body = socket.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 7" in head
    assert body == b'{"a":1}'


def test_an_empty_body_and_a_body_in_pieces_keep_every_byte_in_order() -> None:
    async def answers() -> tuple[Socket, Socket]:
        empty, empty_socket = _cycle()
        await _send(empty, _start(0))
        await _send(empty, {"type": "http.response.body", "body": b""})
        pieces, pieces_socket = _cycle()
        await _send(pieces, _start(6))
        await _send(pieces, {"type": "http.response.body", "body": b"abc", "more_body": True})
        await _send(pieces, {"type": "http.response.body", "body": b"def"})
        return empty_socket, pieces_socket

    empty, pieces = asyncio.run(answers())
    assert len(empty.writes) == 1 and empty.writes[0].endswith(b"content-length: 0\r\n\r\n")
    assert len(pieces.writes) == 2 and pieces.writes[0].endswith(b"\r\n\r\nabc")
    assert pieces.writes[1] == b"def"


def test_what_has_no_body_to_wait_for_is_written_at_once() -> None:
    async def answers() -> tuple[Socket, Socket, Socket]:
        head, head_socket = _cycle("HEAD")
        await _send(head, _start(7))
        streamed, streamed_socket = _cycle()
        await _send(streamed, _start(None))  # no length: chunked, its pieces may come late
        # A client that asked to be told to send its body gets the 100 Continue before any answer.
        waiting, waiting_socket = _cycle(expect_100_continue=True)
        waiting.message_event.set()
        await waiting.receive()
        return head_socket, streamed_socket, waiting_socket

    head, streamed, waiting = asyncio.run(answers())
    assert len(head.writes) == 1 and head.writes[0].startswith(b"HTTP/1.1 200 OK")
    assert len(streamed.writes) == 1 and b"transfer-encoding: chunked" in streamed.writes[0]
    assert waiting.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


def test_a_connection_closed_after_the_head_still_sends_the_head_first() -> None:
    async def failed() -> Socket:
        cycle, socket = _cycle()
        await _send(cycle, _start(7))
        cycle.transport.close()  # what uvicorn does when the app fails after starting its answer
        return socket

    socket = asyncio.run(failed())
    assert len(socket.writes) == 1 and socket.writes[0].startswith(b"HTTP/1.1 200 OK")
    assert socket.closed
