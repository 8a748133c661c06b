"""A response's head leaves with its body in one write to the socket (server/coalesced_writes.py), over
a real socket pair on a real event loop: nothing of a held write reaches the peer before the step ends."""

from __future__ import annotations

import asyncio
import socket

from hyperplan.server.coalesced_writes import HELD_AT_MOST, CoalescingTransport


class _Sink(asyncio.Protocol):
    pass


async def _pair() -> tuple[CoalescingTransport, asyncio.Transport, socket.socket]:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    transport, _ = await loop.create_connection(_Sink, sock=ours)
    return CoalescingTransport(transport, loop), transport, theirs  # type: ignore[arg-type]


def _sent_so_far(peer: socket.socket) -> list[bytes]:
    """Each send the peer's socket has received as one datagram-like read (nothing arrives between)."""
    peer.setblocking(False)
    got = []
    try:
        while chunk := peer.recv(1 << 20):
            got.append(chunk)
    except BlockingIOError:
        pass
    return got


def test_a_head_and_a_body_written_in_one_step_leave_in_one_send() -> None:
    async def scenario() -> None:
        coalescing, _, peer = await _pair()
        coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert _sent_so_far(peer) == []  # held for the rest of this step
        coalescing.write(b"{}")
        assert _sent_so_far(peer) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        coalescing.close()
        peer.close()

    asyncio.run(scenario())


def test_a_write_alone_leaves_at_the_loops_next_turn_and_a_large_one_at_once() -> None:
    async def scenario() -> None:
        coalescing, _, peer = await _pair()
        coalescing.write(b"0\r\n\r\n")
        await asyncio.sleep(0)  # the loop comes round
        assert _sent_so_far(peer) == [b"0\r\n\r\n"]
        large = b"x" * (HELD_AT_MOST + 1)
        coalescing.write(large)
        assert b"".join(_sent_so_far(peer)) == large
        coalescing.close()
        peer.close()

    asyncio.run(scenario())


def test_closing_sends_what_is_held_first() -> None:
    async def scenario() -> None:
        coalescing, transport, peer = await _pair()
        coalescing.write(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n")
        coalescing.close()
        assert transport.is_closing()
        await asyncio.sleep(0.01)  # the transport's own buffer, if any, drains before it closes
        peer.setblocking(True)
        peer.settimeout(10)
        assert peer.recv(1 << 16) == b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n"
        assert peer.recv(1 << 16) == b""  # closed after it
        peer.close()

    asyncio.run(scenario())
