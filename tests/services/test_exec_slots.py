"""The execs a server process admits at once (core/exec_limits.py, services/runtime/exec_slots.py), without a
server: an account's limit, the process's total, administrators, the fleet file's keys, and a slot held
by its command's thread for as long as the command runs, whoever stops waiting for it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hyperplan.core.exec_limits import ExecLimits, ExecRefusal, refusal
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.rate_limits import RateLimit, RequestClass
from hyperplan.errors import ServiceUnavailable, Throttling, ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.exec_slots import ExecSlot, ExecSlots
from tests.core.test_fleet import MINIMAL, demo_text
from tests.harness import wait_until


def caller(name: str, admin: bool = False) -> Caller:
    return Caller(account_id=f"id-{name}", account_name=name, is_admin=admin, access_key_id=f"AK{name}")


ALPHA, BETA, ADMIN = caller("alpha"), caller("beta"), caller("root", admin=True)


# -- the rule, as values ------------------------------------------------------------------------------


def test_an_account_at_its_limit_hears_of_its_own_limit_before_the_servers() -> None:
    limits = ExecLimits(per_account=2, total=3)
    assert refusal(limits, account_running=1, total_running=2, exempt=False) is None
    assert refusal(limits, account_running=2, total_running=2, exempt=False) is ExecRefusal.ACCOUNT_FULL
    assert refusal(limits, account_running=2, total_running=3, exempt=False) is ExecRefusal.ACCOUNT_FULL
    assert refusal(limits, account_running=0, total_running=3, exempt=False) is ExecRefusal.SERVER_FULL


def test_an_administrator_has_no_account_limit_but_the_servers_total() -> None:
    limits = ExecLimits(per_account=1, total=3)
    assert refusal(limits, account_running=2, total_running=2, exempt=True) is None
    assert refusal(limits, account_running=3, total_running=3, exempt=True) is ExecRefusal.SERVER_FULL


@pytest.mark.parametrize(("per_account", "total"), [(0, 8), (9, 8), (1, 0), (1, 1025), (True, 8), (2.0, 8)])
def test_limits_out_of_range_are_refused(per_account: int, total: int) -> None:
    with pytest.raises(ValidationError):
        ExecLimits(per_account=per_account, total=total)


# -- the fleet file --------------------------------------------------------------------------------------


def test_the_fleet_file_sets_both_and_the_demo_documents_the_defaults() -> None:
    assert parse_fleet(MINIMAL).exec_limits == ExecLimits(per_account=8, total=64)
    assert parse_fleet(demo_text()).exec_limits == ExecLimits(per_account=8, total=64)
    text = MINIMAL + "[rate_limits]\nconcurrent_exec = 64\nconcurrent_exec_total = 128\n"
    assert parse_fleet(text).exec_limits == ExecLimits(per_account=64, total=128)
    # A total below the default account limit lowers the default with it.
    assert parse_fleet(MINIMAL + "[rate_limits]\nconcurrent_exec_total = 4\n").exec_limits == ExecLimits(4, 4)
    # The request rates beside them are read as before.
    fleet = parse_fleet(MINIMAL + "[rate_limits]\nconcurrent_exec = 2\nsearch = { rate = 1, burst = 3 }\n")
    assert fleet.exec_limits.per_account == 2 and fleet.rate_limits[RequestClass.SEARCH] == RateLimit(1, 3)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("concurrent_exec = 0", "rate_limits.concurrent_exec: 0 is less than 1"),
        ('concurrent_exec = "8"', "rate_limits.concurrent_exec: '8' is not a whole number"),
        ("concurrent_exec = 65", "rate_limits.concurrent_exec: 65 is more than concurrent_exec_total, 64"),
        (
            "concurrent_exec = 9\nconcurrent_exec_total = 8",
            "rate_limits.concurrent_exec: 9 is more than concurrent_exec_total, 8",
        ),
        ("concurrent_exec_total = 1025", "rate_limits.concurrent_exec_total: 1025 is more than 1024"),
        ("concurrent_exec_total = 2.5", "rate_limits.concurrent_exec_total: 2.5 is not a whole number"),
        ("concurrent_execs = 3", "rate_limits.concurrent_execs: unknown key"),
    ],
)
def test_refusals_name_the_key(entries: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(MINIMAL + f"[rate_limits]\n{entries}\n")
    assert caught.value.message.startswith(message), caught.value.message


# -- the counts -----------------------------------------------------------------------------------------


def test_an_account_beyond_its_limit_is_throttled_while_another_is_admitted() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=2, total=5)
    held = [slots.take(ALPHA, limits), slots.take(ALPHA, limits)]
    with pytest.raises(Throttling) as caught:
        slots.take(ALPHA, limits)
    assert "'alpha' is running 2 exec calls, its limit" in caught.value.message
    assert caught.value.code == "ThrottlingException"
    held.append(slots.take(BETA, limits))
    assert (slots.running(ALPHA.account_id), slots.running(BETA.account_id), slots.running()) == (2, 1, 3)
    held[0].release()
    held.append(slots.take(ALPHA, limits))  # a slot given back is there again
    assert slots.running(ALPHA.account_id) == 2


def test_beyond_the_total_every_caller_is_refused_with_service_unavailable() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=2, total=3)
    for who in (ALPHA, ALPHA, BETA):
        slots.take(who, limits)
    for who in (BETA, ADMIN):
        with pytest.raises(ServiceUnavailable) as caught:
            slots.take(who, limits)
        assert caught.value.status == 503 and "running 3 exec calls, its most at once" in caught.value.message


def test_an_administrator_runs_past_an_accounts_limit() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=1, total=3)
    for _ in range(3):
        slots.take(ADMIN, limits)
    assert slots.running(ADMIN.account_id) == 3


def test_a_slot_is_given_back_once_however_often_it_is_released() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=2, total=2)
    first, second = slots.take(ALPHA, limits), slots.take(ALPHA, limits)
    first.release()
    first.release()
    assert slots.running() == 1
    second.release()
    assert slots.running() == 0 and slots.running(ALPHA.account_id) == 0


# -- the threads ----------------------------------------------------------------------------------------


def test_the_command_runs_on_a_thread_of_its_own_which_gives_the_slot_back_when_it_ends() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=1, total=1)
    go = threading.Event()
    seen: list[threading.Thread] = []

    def command() -> str:
        seen.append(threading.current_thread())
        go.wait(30)
        return "done"

    running = slots.take(ALPHA, limits).run(command, name="exec-alpha")
    with pytest.raises(Throttling):
        slots.take(ALPHA, limits)
    go.set()
    assert running.result(30) == "done"
    assert seen[0] is not threading.current_thread() and seen[0].daemon and seen[0].name == "exec-alpha"
    seen[0].join(30)
    assert slots.running() == 0


def test_a_failing_command_hands_its_error_to_the_waiter_and_frees_its_slot() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=1, total=1)

    def command() -> None:
        raise ServiceUnavailable("the cluster did not answer")

    running = slots.take(ALPHA, limits).run(command)
    with pytest.raises(ServiceUnavailable):
        running.result(30)
    assert wait_until(lambda: slots.running() == 0)


def test_a_waiter_that_gives_up_leaves_the_slot_held_until_the_command_ends() -> None:
    """The request awaiting the command is cancelled (its client gone, the server stopping): the thread
    still runs, so its slot stays counted, and is given back when the command ends."""
    slots, limits = ExecSlots(), ExecLimits(per_account=1, total=1)
    go = threading.Event()
    slot = slots.take(ALPHA, limits)

    async def wait_then_give_up() -> None:
        waiting = asyncio.ensure_future(asyncio.wrap_future(slot.run(lambda: go.wait(30))))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(wait_then_give_up())
    assert slots.running(ALPHA.account_id) == 1
    go.set()
    assert wait_until(lambda: slots.running() == 0)


def test_several_threads_taking_at_once_never_pass_the_limit() -> None:
    slots, limits = ExecSlots(), ExecLimits(per_account=5, total=5)
    start = threading.Barrier(20)
    taken: list[ExecSlot] = []
    refused: list[Exception] = []

    def take() -> None:
        start.wait(30)
        try:
            taken.append(slots.take(ALPHA, limits))
        except Throttling as error:
            refused.append(error)

    threads = [threading.Thread(target=take) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert (len(taken), len(refused), slots.running()) == (5, 15, 5)
