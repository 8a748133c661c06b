"""Where a request is answered (server/loop_or_pool.py): on the event loop when neither step waits; a step
that would wait there finished in the thread pool, from that step's start, and a request admitted on the
loop never admitted again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from hyperplan.server import loop_or_pool
from hyperplan.waits import done_on_the_loop, may_wait, note_done_on_the_loop


class Steps:
    """An answer's two steps, each noting the thread it ran on; `waits` names the steps that wait."""

    def __init__(self, *waits: str) -> None:
        self.waits = set(waits)
        self.ran: list[tuple[str, bool]] = []  # (step, on the loop's thread)
        self.loop_thread = threading.get_ident()
        self.read_ahead_entered = 0

    def _step(self, name: str) -> None:
        if name in self.waits:
            may_wait(f"the {name} step")  # before any side effect, as every waiting point does
        self.ran.append((name, threading.get_ident() == self.loop_thread))

    def admit(self) -> str:
        self._step("admit")
        return "admitted"

    def respond(self, admitted: str) -> str:
        assert admitted == "admitted"
        self._step("respond")
        return "answer"

    def read_ahead(self) -> AbstractAsyncContextManager[None]:
        @asynccontextmanager
        async def entered() -> AsyncIterator[None]:
            self.read_ahead_entered += 1
            yield

        return entered()


def answered(steps: Steps, *, on_the_loop: bool) -> str:
    async def main() -> str:
        steps.loop_thread = threading.get_ident()
        return await loop_or_pool.answer(
            steps.admit, steps.respond, on_the_loop=on_the_loop, read_ahead=steps.read_ahead
        )

    return asyncio.run(main())


def test_a_request_that_waits_nowhere_is_answered_on_the_loop() -> None:
    steps = Steps()
    assert answered(steps, on_the_loop=True) == "answer"
    assert steps.ran == [("admit", True), ("respond", True)]
    assert steps.read_ahead_entered == 1


def test_a_handler_that_would_wait_is_finished_in_the_pool_without_a_second_admission() -> None:
    steps = Steps("respond")
    assert answered(steps, on_the_loop=True) == "answer"
    assert steps.ran == [("admit", True), ("respond", False)]


def test_an_admission_that_would_wait_is_made_in_the_pool_with_the_rest() -> None:
    steps = Steps("admit")
    assert answered(steps, on_the_loop=True) == "answer"
    assert steps.ran == [("admit", False), ("respond", False)]


def test_a_request_not_tried_on_the_loop_is_answered_in_the_pool_alone() -> None:
    steps = Steps()
    assert answered(steps, on_the_loop=False) == "answer"
    assert steps.ran == [("admit", False), ("respond", False)]
    assert steps.read_ahead_entered == 0


def test_what_the_loop_did_the_pool_may_skip() -> None:
    """A step the loop's try noted done (a write's refusals read on a snapshot) is seen as done by the
    pool's try of the same request, and by no other request."""
    seen: list[bool] = []

    def respond(_admitted: str) -> str:
        seen.append(done_on_the_loop("the snapshot"))
        note_done_on_the_loop("the snapshot")
        may_wait("the writers' turn")
        return "answer"

    async def main() -> list[str]:
        return [
            await loop_or_pool.answer(
                lambda: "admitted", respond, on_the_loop=True, read_ahead=Steps().read_ahead
            )
            for _ in range(2)
        ]

    assert asyncio.run(main()) == ["answer", "answer"]
    assert seen == [False, True, False, True]  # each request: not done on the loop, done in the pool
