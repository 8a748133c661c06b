"""The guard of answers on the event loop (hyperplan/waits.py): what may wait refuses to under
`forbid_waits()`, and only there (not in another thread, not after the block)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from hyperplan.waits import WouldWait, forbid_waits, holding, may_wait, waits_forbidden


def test_a_wait_is_refused_only_within_the_block() -> None:
    may_wait("anything")  # outside: nothing happens
    with forbid_waits():
        assert waits_forbidden()
        with pytest.raises(WouldWait) as refused:
            may_wait("a read of the store")
        assert refused.value.what == "a read of the store"
    assert not waits_forbidden()
    may_wait("anything")


def test_would_wait_is_no_error_an_except_exception_could_answer() -> None:
    """It must reach the server, which answers the request again in the thread pool."""
    caught = []
    with pytest.raises(WouldWait), forbid_waits():
        try:
            may_wait("a lease")
        except Exception as exc:  # the one place that turns errors into responses catches this
            caught.append(exc)
    assert not caught and not issubclass(WouldWait, Exception)


def test_another_thread_is_free_to_wait() -> None:
    """The mark belongs to the context that set it: the pool's threads never see it."""
    with forbid_waits(), ThreadPoolExecutor(1) as pool:
        assert pool.submit(waits_forbidden).result() is False
        pool.submit(may_wait, "a read").result()


def test_a_lock_held_elsewhere_refuses_at_once_on_the_loop_and_waits_off_it() -> None:
    lock = threading.Lock()
    with holding(lock, "the calendar"):  # free: taken, and given back after
        assert lock.locked()
    assert not lock.locked()
    with forbid_waits():
        with holding(lock, "the calendar"):  # free: taken on the loop too
            assert lock.locked()
        lock.acquire()  # as a pool thread would hold it
        try:
            with pytest.raises(WouldWait) as refused, holding(lock, "the calendar"):
                pass
            assert refused.value.what == "the calendar"
        finally:
            lock.release()
    assert not lock.locked()
    taken = threading.Event()
    released = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            released.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(30)
        released.set()
        with holding(lock, "the calendar"):  # off the loop: waits for the holder, then has it
            assert lock.locked()
    finally:
        released.set()
        holder.join()
