"""The worker under every background loop: woken by work, named, backing off on errors, stoppable."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from hyperplan.worker import LocalWake, Worker, backoff_seconds

LONG = 60.0  # a poll no test waits for: what happens sooner was caused by a wake


class Steps:
    """A step that records who ran it, and lets a test wait for the n-th run."""

    def __init__(self, fail_first: int = 0) -> None:
        self.runs = 0
        self.thread_names: list[str] = []
        self.fail_first = fail_first
        self._ran = threading.Condition()

    def __call__(self) -> float | None:
        with self._ran:
            self.runs += 1
            self.thread_names.append(threading.current_thread().name)
            self._ran.notify_all()
            if self.runs <= self.fail_first:
                raise RuntimeError(f"bad moment {self.runs}")
        return None

    def wait_for(self, runs: int, timeout: float = 20) -> bool:
        with self._ran:
            return self._ran.wait_for(lambda: self.runs >= runs, timeout)


@pytest.fixture
def make_worker() -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(name: str, step: Steps, **options: float) -> Worker:
        worker = Worker(name, step, **options)  # type: ignore[arg-type]
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.stop()


def test_a_wake_runs_the_step_without_waiting_for_the_poll(make_worker: Callable[..., Worker]) -> None:
    steps = Steps()
    worker = make_worker("test-wake", steps, poll=LONG)
    worker.start()
    assert steps.wait_for(1)  # the first pass runs at start
    worker.wake()
    assert steps.wait_for(2)
    worker.wake()
    assert steps.wait_for(3)


def test_the_step_runs_on_a_thread_named_after_the_worker(make_worker: Callable[..., Worker]) -> None:
    steps = Steps()
    make_worker("node-watcher-under-test", steps, poll=LONG).start()
    assert steps.wait_for(1)
    assert steps.thread_names == ["node-watcher-under-test"]


def test_a_failing_step_is_logged_by_name_and_retried_after_a_back_off(
    make_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    steps = Steps(fail_first=2)
    worker = make_worker("flaky-loop", steps, poll=LONG, backoff_base=0.01, backoff_max=0.02)
    with caplog.at_level(logging.ERROR, logger="hyperplan.worker"):
        worker.start()
        assert steps.wait_for(3)  # retried without any wake: the back-off, not the 60 s poll
    failures = [r for r in caplog.records if "flaky-loop" in r.getMessage()]
    assert len(failures) == 2
    assert failures[0].exc_info is not None and "bad moment 1" in str(failures[0].exc_info[1])
    assert worker.failures == 0  # the third step succeeded


def test_stop_ends_the_thread_and_a_stopped_worker_runs_no_more(make_worker: Callable[..., Worker]) -> None:
    steps = Steps()
    worker = make_worker("stopping", steps, poll=LONG)
    worker.start()
    assert steps.wait_for(1)
    worker.stop()
    assert not worker.running
    runs = steps.runs
    worker.wake()
    assert not steps.wait_for(runs + 1, timeout=0.2)


def test_a_stop_request_alone_is_seen_at_the_next_poll(make_worker: Callable[..., Worker]) -> None:
    """request_stop only sets a flag (it is called from a signal handler); the poll bounds the wait."""
    steps = Steps()
    worker = make_worker("signalled", steps, poll=0.05)
    worker.start()
    assert steps.wait_for(1)
    worker.request_stop()
    thread = next(t for t in threading.enumerate() if t.name == "signalled")
    thread.join(timeout=20)
    assert not thread.is_alive()


def test_a_notification_before_the_wait_is_not_lost() -> None:
    wake = LocalWake()
    wake.notify()
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (wake.wait(LONG), done.set()))
    waiter.start()
    assert done.wait(20)
    waiter.join()


def test_the_back_off_doubles_up_to_its_cap() -> None:
    assert [backoff_seconds(n, 0.5, 3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_seconds(10**6, 0.5, 30.0) == 30.0  # no overflow after a very long outage
