"""A return never overbooks nor double-books (issue 53), checked from the stored rows after every change.

Returns give capacity back to the calendar while others buy it: the pool's holding segments must never
exceed its reservable count at any instant, what a plan returned must never also be held by that plan
(its held and returned instances together stay within what it bought, at every instant), the live
calendar must read what the store holds (else the next search sells what is not free, or hides what
is), and a quote is carried out at most once. A property test plays random scripts of purchases,
quotes, returns and clock moves by several accounts on one small flexible pool (SQLite); then threads
buy and return at once on one store (SQLite and PostgreSQL, tests/postgres.py), and two threads carry
out the same quote at once. Purchases alone: tests/services/test_booking_properties.py.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.app import AppConfig, Application
from hyperplan.core.calendar import slot_of, slot_start
from hyperplan.core.returns import Scope, next_boundary
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import Conflict, ResourceLimitExceeded, ResourceNotFound, ValidationError
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans, returns
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import held
from hyperplan.store.schema import (
    LedgerEntry,
    PlanReturn,
    ReservedCapacity,
    ReturnedWindow,
    ReturnQuote,
    TrainingPlan,
)
from tests.harness import SERVER_START, unisolated
from tests.postgres import Stores

P5 = "ml.p5.48xlarge"
ZONE = "us-west-2a"
POOL = (P5, ZONE)
RESERVABLE = 4
FLEET = (
    'region = "us-west-2"\ncurrency = "USD"\n'
    f'[[zones]]\nname = "{ZONE}"\nzone_id = "usw2-az1"\nsubnets = []\n'
    f'[[pools]]\ninstance_type = "{P5}"\nzone = "{ZONE}"\ncount = {RESERVABLE + 1}\n'
    f'reservable = {RESERVABLE}\nprice_per_instance_hour = "10"\n'
    '[policy]\nallowed_counts = "any"\nhorizon = "14d"\n'
    '[cancellation]\npreset = "flexible"\n'
)
"""One pool of 4 reservable p5s (5 in all), returns allowed (flexible), any count, a short horizon:
small enough that purchases and returns keep meeting in the same slots."""
SCOPE_KINDS = ("plan", "segment", "instances", "tail")
CALENDAR_DAYS = 20  # past the horizon: everything a plan of these fleets can hold
Interval = tuple[datetime, datetime, int]


# -- the rows, checked ---------------------------------------------------------------------------------


@dataclass
class Books:
    """What the test knows besides the store: each plan's segments as bought (by plan id), and the
    quotes it saw carried out."""

    bought: dict[int, list[Interval]] = field(default_factory=dict)
    carried: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note_purchase(self, runtime: ServiceContext, account_id: str, name: str) -> None:
        """The plan's segments right after its purchase: the most it may ever hold or give back."""
        with runtime.db.read() as session:
            plan_id = session.scalar(
                select(TrainingPlan.id).where(
                    TrainingPlan.account_id == account_id, TrainingPlan.name == name
                )
            )
            rows = session.execute(
                select(ReservedCapacity.start, ReservedCapacity.end, ReservedCapacity.count).where(
                    ReservedCapacity.plan_id == plan_id
                )
            ).all()
        assert plan_id is not None and rows, name
        with self.lock:
            self.bought[plan_id] = [(start, end, count) for start, end, count in rows]

    def note_carried(self, quote_id: str) -> None:
        with self.lock:
            assert quote_id not in self.carried, f"return quote {quote_id} was carried out twice"
            self.carried.add(quote_id)


def _at(intervals: Iterable[Interval], moment: datetime) -> int:
    return sum(count for start, end, count in intervals if start <= moment < end)


def _broken_rules(session: Session, books: Books, reservable: int) -> list[str]:
    """Every way the store breaks the rules now (empty: none), read in one snapshot."""
    with books.lock:
        bought = dict(books.bought)
        carried = set(books.carried)
    holdings = held(session)
    return [
        *_overbooked(holdings, reservable),
        *_double_booked(session, bought),
        *_quotes_used_twice(session, carried),
        *_refunded_more_than_paid(session),
    ]


def _overbooked(holdings: list[Any], reservable: int) -> list[str]:
    """Each instant some pool holds more than it may (its busiest instants are its segments' starts)."""
    broken = []
    by_pool: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    for pool, start, end, count in holdings:
        by_pool[pool].append((start, end, count))
    for pool, intervals in by_pool.items():
        for start, _, _ in intervals:
            if _at(intervals, start) > reservable:
                broken.append(f"{pool} holds {_at(intervals, start)} > {reservable} at {start}")
    return broken


def _double_booked(session: Session, bought: dict[int, list[Interval]]) -> list[str]:
    """Each instant a plan holds and has returned more than it bought, and each window given back
    before its return (a return never gives back the past)."""
    segments: dict[int, list[Interval]] = defaultdict(list)
    end = func.coalesce(ReservedCapacity.released_at, ReservedCapacity.end)
    for plan_id, start, stop, count in session.execute(
        select(ReservedCapacity.plan_id, ReservedCapacity.start, end, ReservedCapacity.count).where(
            ReservedCapacity.holds_capacity.is_(True)
        )
    ):
        segments[plan_id].append((start, stop, count))
    windows: dict[int, list[Interval]] = defaultdict(list)
    broken = []
    for plan_id, start, stop, count, at in session.execute(
        select(
            ReturnedWindow.plan_id,
            ReturnedWindow.start,
            ReturnedWindow.end,
            ReturnedWindow.count,
            PlanReturn.at,
        ).join(PlanReturn, PlanReturn.id == ReturnedWindow.return_id)
    ):
        windows[plan_id].append((start, stop, count))
        if start < at:
            broken.append(f"plan {plan_id} gave back {count} from {start}, before its return at {at}")
    for plan_id, given_back in windows.items():
        if plan_id not in bought:
            continue  # bought by a thread that has not noted it yet
        kept, original = segments[plan_id], bought[plan_id]
        for moment in {start for start, _, _ in [*kept, *given_back, *original]}:
            both = _at(kept, moment) + _at(given_back, moment)
            if both > _at(original, moment):
                broken.append(
                    f"plan {plan_id} at {moment}: holds {_at(kept, moment)} and returned "
                    f"{_at(given_back, moment)}, of {_at(original, moment)} bought"
                )
    return broken


def _quotes_used_twice(session: Session, carried: set[str]) -> list[str]:
    """Each quote returned more than once, a used quote with no return or a return whose quote is not
    marked used, and each return the callers were never told of."""
    broken = []
    returned = Counter(session.scalars(select(PlanReturn.quote_id)))
    broken += [f"return quote {q} carried out {n} times" for q, n in returned.items() if n > 1]
    used = set(session.scalars(select(ReturnQuote.id).where(ReturnQuote.used_at.is_not(None))))
    if used != set(returned):
        broken.append(f"quotes marked used {sorted(used)} are not those returned {sorted(returned)}")
    if not carried <= set(returned):
        broken.append(f"returns told to callers but not stored: {sorted(carried - set(returned))}")
    return broken


def _refunded_more_than_paid(session: Session) -> list[str]:
    refunds: dict[int, Decimal] = defaultdict(Decimal)
    for plan_id, refund in session.execute(select(PlanReturn.plan_id, PlanReturn.refund)):
        refunds[plan_id] += refund
    fees = {
        plan_id: fee for plan_id, fee in session.execute(select(TrainingPlan.id, TrainingPlan.upfront_fee))
    }
    return [f"plan {p} refunded {r} of {fees[p]} paid" for p, r in refunds.items() if r > fees[p]]


def _refunded_twice(session: Session) -> list[str]:
    """Each quote whose refund went to the ledger more than once (its line names the quote)."""
    quotes = session.scalars(select(ReturnQuote.id))
    lines = list(
        session.scalars(select(LedgerEntry.description).where(LedgerEntry.description.like("Refund%")))
    )
    return [f"quote {q} refunded {n} times" for q in quotes if (n := sum(q in line for line in lines)) > 1]


def _calendar_disagrees(runtime: ServiceContext) -> list[str]:
    """Each slot from now on where the live calendar's booked count is not what the store holds."""
    now = runtime.clock.now()
    first, stop = slot_of(now), slot_of(now + timedelta(days=CALENDAR_DAYS))
    with runtime.db.read() as session:
        stored = [(s, e, n) for pool, s, e, n in held(session) if pool == POOL]
    profile = runtime.calendar.profile(POOL, slot_start(first), slot_start(stop))
    broken = []
    for slot in range(first, stop):
        moment = slot_start(slot)
        booked = next((count for start, count in reversed(profile) if start <= moment), 0)
        if booked != _at(stored, moment):
            broken.append(f"the calendar books {booked} at {moment}, the store holds {_at(stored, moment)}")
    return broken[:3]


def _assert_sound(runtime: ServiceContext, books: Books, when: str) -> None:
    with runtime.db.read() as session:
        broken = _broken_rules(session, books, RESERVABLE)
    broken += _calendar_disagrees(runtime)
    assert not broken, f"{when}:\n" + "\n".join(broken)


# -- the service, started ------------------------------------------------------------------------------


def _started(tmp: Path, database_url: str | None) -> Application:
    fleet_path = tmp / "fleet.toml"
    fleet_path.write_text(FLEET)
    application = Application(
        AppConfig(
            data_dir=tmp / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=SERVER_START,
            database_url=database_url,
            **unisolated(tmp / "data"),
        )
    )
    application.start()
    return application


def _accounts(runtime: ServiceContext, names: Iterable[str]) -> list[Caller]:
    """An account of its own per name (no administrator: each sees only its plans)."""
    callers = []
    for name in names:
        with runtime.db.write() as session:
            key = accounts.create_account(session, name, box=runtime.secret_box, now=runtime.clock.now())
        callers.append(Caller(key.account_id, name, False, key.access_key_id))
    return callers


def _administrator(runtime: ServiceContext) -> Caller:
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
    return Caller(admin.id, admin.name, True, "key")


def _plans_of(runtime: ServiceContext, caller: Caller) -> list[tuple[str, list[int]]]:
    """The caller's plans (by name, oldest first), each with its holding segments' ordinals."""
    with runtime.db.read() as session:
        rows = session.execute(
            select(TrainingPlan.name, ReservedCapacity.ordinal)
            .outerjoin(
                ReservedCapacity,
                (ReservedCapacity.plan_id == TrainingPlan.id) & ReservedCapacity.holds_capacity.is_(True),
            )
            .where(TrainingPlan.account_id == caller.account_id)
            .order_by(TrainingPlan.id, ReservedCapacity.ordinal)
        ).all()
    ordinals: dict[str, list[int]] = {}
    for name, ordinal in rows:
        ordinals.setdefault(name, [])
        if ordinal is not None:
            ordinals[name].append(ordinal)
    return list(ordinals.items())


def _scope(
    runtime: ServiceContext, kind: str, ordinals: list[int], pick: int, instances: int, tail_days: int | None
) -> Scope:
    """A scope as a caller would ask it: a segment the plan has (or one past them: a mistake); a tail
    from the next boundary (None) or from a boundary `tail_days` after it."""
    ordinal = ordinals[pick] if pick < len(ordinals) else max(ordinals, default=0) + 1
    if kind == "plan":
        return Scope("plan")
    if kind == "segment":
        return Scope("segment", ordinal=ordinal)
    if kind == "instances":
        return Scope("instances", ordinal=ordinal, instances=instances)
    if tail_days is None:
        return Scope("tail", ordinal=ordinal)
    boundary = next_boundary(runtime.clock.now(), runtime.fleet.policy.segment_end)
    return Scope("tail", ordinal=ordinal, start=boundary + timedelta(days=tail_days))


# -- 1. random scripts, one step at a time -------------------------------------------------------------

BUYERS = 3
buy = st.tuples(
    st.just("buy"),
    st.integers(0, BUYERS - 1),
    st.integers(1, RESERVABLE),  # instances
    st.sampled_from((12, 24, 48, 72)),  # hours
    st.integers(0, 3),  # days from now the search's window opens
)
ask = st.tuples(
    st.sampled_from(("quote", "return")),  # "return": quote, then carry it out at once
    st.integers(0, 9),  # which plan (of any account: its own asks)
    st.sampled_from(SCOPE_KINDS),
    st.sampled_from((0, 0, 0, 1, 2)),  # which of its segments (past the last: one it does not have)
    st.integers(1, RESERVABLE),  # K instances
    st.one_of(st.none(), st.integers(0, 3)),  # tail: from the next boundary, or so many days later
)
carry = st.tuples(
    st.just("carry"),
    st.integers(0, 9),  # which quote seen so far (any: used, stale, or still good)
    st.sampled_from(("owner", "administrator", "another account")),
)
advance = st.tuples(st.just("advance"), st.integers(1, 60 * 24 * 2))
scripts = st.lists(st.one_of(buy, buy, ask, ask, ask, carry, advance), min_size=8, max_size=24)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts)
def test_returns_among_purchases_never_overbook_nor_double_book(
    tmp_path_factory: Any, script: list[tuple]
) -> None:
    application = _started(tmp_path_factory.mktemp("returns"), None)
    try:
        _play(application.context, script)
    finally:
        application.stop()


@dataclass
class _Stage:
    runtime: ServiceContext
    buyers: list[Caller]
    administrator: Caller
    books: Books = field(default_factory=Books)
    quotes: list[tuple[str, Caller]] = field(default_factory=list)  # (quote id, its account)


def _play(runtime: ServiceContext, script: list[tuple]) -> None:
    stage = _Stage(
        runtime, _accounts(runtime, (f"buyer-{n}" for n in range(BUYERS))), _administrator(runtime)
    )
    moves: dict[str, Callable[[_Stage, int, tuple], None]] = {
        "buy": _buy_step,
        "quote": _ask_step,
        "return": _ask_step,
        "carry": _carry_step,
        "advance": _advance_step,
    }
    for number, step in enumerate(script):
        moves[step[0]](stage, number, step)
        _assert_sound(runtime, stage.books, f"after step {number}, {step}")


def _buy_step(stage: _Stage, number: int, step: tuple) -> None:
    _, who, count, hours, days_ahead = step
    runtime, caller = stage.runtime, stage.buyers[who]
    opens = runtime.clock.now() + timedelta(days=days_ahead)
    request = SearchRequest(P5, count, hours, "training-job", opens, None)
    found = plans.search(runtime, caller, request)
    if found:  # every offering returned can be bought right after it is returned, returns or not
        plans.create(runtime, caller, f"plan-{number}", found[0].offering_id)
        stage.books.note_purchase(runtime, caller.account_id, f"plan-{number}")


def _ask_step(stage: _Stage, number: int, step: tuple) -> None:
    what, plan_pick, kind, segment_pick, instances, tail_days = step
    runtime = stage.runtime
    owned = [
        (buyer, name, ordinals) for buyer in stage.buyers for name, ordinals in _plans_of(runtime, buyer)
    ]
    if not owned:
        return
    caller, name, ordinals = owned[plan_pick % len(owned)]
    scope = _scope(runtime, kind, ordinals, segment_pick, instances, tail_days)
    try:
        quoted = returns.quote(runtime, caller, name, scope)
    except ValidationError:  # what cannot be returned says why (tests/server/test_returns.py)
        event(f"{kind} quote refused")
        return
    event(f"{kind} quoted")
    stage.quotes.append((quoted.quote_id, caller))
    if what == "return":  # nothing changed since: the quote holds
        stage.books.note_carried(returns.carry_out(runtime, caller, quoted.quote_id).quote_id)
        event(f"{kind} returned")


def _carry_step(stage: _Stage, number: int, step: tuple) -> None:
    _, pick, by = step
    if not stage.quotes:
        return
    quote_id, owner = stage.quotes[pick % len(stage.quotes)]
    caller = {
        "owner": owner,
        "administrator": stage.administrator,
        "another account": next(b for b in stage.buyers if b.account_id != owner.account_id),
    }[by]
    try:
        returns.carry_out(stage.runtime, caller, quote_id)
    except ResourceNotFound:
        assert by == "another account", f"{by} was told quote {quote_id} does not exist"
        return
    except Conflict as stale:
        assert "ask for a new quote" in stale.message, stale.message
        event("a quote carried out later: stale")
        return
    event("a quote carried out later")
    assert by != "another account", f"quote {quote_id} was carried out by an account not its own"
    stage.books.note_carried(quote_id)


def _advance_step(stage: _Stage, number: int, step: tuple) -> None:
    stage.runtime.advance_clock(stage.runtime.clock.now() + timedelta(minutes=step[1]))


# -- 2. threads at once --------------------------------------------------------------------------------

RACERS = 6
ROUNDS = 6
REFUSALS = (ResourceLimitExceeded, Conflict, ValidationError, ResourceNotFound)
"""What a racing request may be told: capacity gone, a stale quote, nothing left to return, a plan
gone. Anything else (an IntegrityError, or any error the server would answer with a 500) is a bug."""


@dataclass
class _Race:
    runtime: ServiceContext
    books: Books
    start: threading.Barrier
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def attempt(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`'s answer, or None when it was refused as a racing request may be."""
        try:
            answer = call(*args)
        except REFUSALS as refusal:
            self.outcomes[f"{what}: {type(refusal).__name__}"] += 1
            return None
        except Exception as exc:  # the point: nothing else may come out
            self.unexpected.append(f"{what}: {type(exc).__name__}: {exc}")
            return None
        self.outcomes[f"{what}: ok"] += 1
        return answer


def test_racing_purchases_and_returns_never_overbook_nor_double_book(stores: Stores, tmp_path: Path) -> None:
    """Six accounts buy and return at once, each round: a search and a purchase, a quote of some part
    of one of its plans and its return, and the same quote again (refused: used); the first also moves
    the clock 5 hours after each of its rounds, and one more thread reads the store meanwhile. The rules
    hold in between and at the end, and every refusal is one a caller can act on."""
    application = _started(tmp_path, stores.url())
    runtime = application.context
    try:
        race = _Race(runtime, Books(), threading.Barrier(RACERS))
        buyers = _accounts(runtime, (f"racer-{n}" for n in range(RACERS)))
        threads = [threading.Thread(target=_racer, args=(race, buyers[n], n)) for n in range(RACERS)]
        checker = threading.Thread(target=_checker, args=(race,))
        for thread in [*threads, checker]:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        race.done.set()
        checker.join(timeout=60)
        assert not race.unexpected, race.unexpected
        counts = race.outcomes
        assert counts["buy: ok"] and counts["buy: ResourceLimitExceeded"], counts  # they collided
        assert counts["return: ok"] and counts["return again: Conflict"] >= counts["return: ok"], counts
        assert not counts["return again: ok"], counts
        _assert_sound(runtime, race.books, f"after the race, {dict(counts)}")
        with runtime.db.read() as session:
            assert not _refunded_twice(session)
    finally:
        application.stop()


def _racer(race: _Race, caller: Caller, number: int) -> None:
    race.start.wait()
    for round_ in range(ROUNDS):
        _buy_in_the_race(race, caller, f"race-{number}-{round_}", 1 + (number + round_) % RESERVABLE, round_)
        _return_in_the_race(race, caller, number + round_)
        if number == 0:  # the clock moves on while the others are still at it
            race.attempt("clock", race.runtime.advance_clock, race.runtime.clock.now() + timedelta(hours=5))


def _buy_in_the_race(race: _Race, caller: Caller, name: str, count: int, round_: int) -> None:
    request = SearchRequest(P5, count, 24 * (1 + round_ % 3), "training-job", None, None)
    found = race.attempt("search", plans.search, race.runtime, caller, request)
    if found and race.attempt("buy", plans.create, race.runtime, caller, name, found[0].offering_id):
        race.books.note_purchase(race.runtime, caller.account_id, name)


def _return_in_the_race(race: _Race, caller: Caller, turn: int) -> None:
    """A part of one of the caller's plans quoted and returned, then the same quote again."""
    runtime = race.runtime
    owned = [(plan, ordinals) for plan, ordinals in _plans_of(runtime, caller) if ordinals]
    if not owned:
        return
    plan, ordinals = owned[turn % len(owned)]
    scope = _scope(runtime, SCOPE_KINDS[turn % len(SCOPE_KINDS)], ordinals, 0, 1, None)
    quoted = race.attempt("quote", returns.quote, runtime, caller, plan, scope)
    if quoted is None:
        return
    if race.attempt("return", returns.carry_out, runtime, caller, quoted.quote_id):
        race.books.note_carried(quoted.quote_id)
    race.attempt("return again", returns.carry_out, runtime, caller, quoted.quote_id)


def _checker(race: _Race) -> None:
    """The rules, read from the store while the race runs (each read one snapshot)."""
    while not race.done.wait(0.05):
        with race.runtime.db.read() as session:
            broken = _broken_rules(session, race.books, RESERVABLE)
        if broken:
            race.unexpected.append("during the race:\n" + "\n".join(broken))
            return


def test_one_quote_carried_out_from_two_threads_at_once_returns_once(stores: Stores, tmp_path: Path) -> None:
    """The owner and an administrator carry out the same quote at the same moment, several times over:
    one return each time, one refund; the other is told the quote was used (never an IntegrityError
    from the unique quote of a return)."""
    application = _started(tmp_path, stores.url())
    runtime = application.context
    try:
        owner, administrator = _accounts(runtime, ["owner"])[0], _administrator(runtime)
        books = Books()
        found = plans.search(
            runtime, owner, SearchRequest(P5, RESERVABLE, 24 * 5, "training-job", None, None)
        )
        plans.create(runtime, owner, "whole", found[0].offering_id)
        books.note_purchase(runtime, owner.account_id, "whole")
        scopes = [Scope("instances", ordinal=1, instances=1)] * (RESERVABLE - 1) + [Scope("plan")]
        for scope in scopes:
            quote_id = returns.quote(runtime, owner, "whole", scope).quote_id
            race = _Race(runtime, books, threading.Barrier(2))
            both = [
                threading.Thread(target=_carry_at_once, args=(race, caller, quote_id))
                for caller in (owner, administrator)
            ]
            for thread in both:
                thread.start()
            for thread in both:
                thread.join(timeout=60)
            assert not race.unexpected, race.unexpected
            assert race.outcomes == Counter({"return: ok": 1, "return: Conflict": 1}), race.outcomes
            _assert_sound(runtime, books, f"after returning {scope} from two threads")
        with runtime.db.read() as session:
            returned = session.scalar(select(func.count()).select_from(PlanReturn))
            assert returned == len(scopes), returned
            assert not _refunded_twice(session)
    finally:
        application.stop()


def _carry_at_once(race: _Race, caller: Caller, quote_id: str) -> None:
    race.start.wait()
    if race.attempt("return", returns.carry_out, race.runtime, caller, quote_id):
        race.books.note_carried(quote_id)
