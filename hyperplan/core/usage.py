"""Instance-time per pool and UTC day, from spans of service time (the usage report's arithmetic;
services/plans/usage.py reads the spans from the store, docs/OPERATIONS.md says what each column means).

A plan's use is what its consumers held of its reservation: at each instant, in each pool, the
instances they held, but never more than the plan reserved there then. Counted so, a plan's used time
never exceeds its reserved time, whatever its records say (a consumer recorded past its segment, say,
or two of them holding more than the segment between them).

Times are added as `timedelta`s, which are whole microseconds: a sum does not depend on the order of
its terms, so "used <= reserved" holds exactly, and still after the one division into hours.

Money (a spot run's charge, a lending plan's credit) is not spread over the time it paid for: each
amount counts whole on the UTC day of its instant (`amounts_per_day`), so a day's figure is what the
ledger wrote that day.

The monthly books (`months`) fold an account's days into calendar months: reserved, used, lent and
returned time, and the money of each (paid, refunded, credited); idle time and the net cost are derived
there, in one place, so that every reader (API, CLI, console) shows the same arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_DOWN, Decimal

Pool = tuple[str, str]  # instance type, availability zone
PoolDay = tuple[Pool, date]
NOTHING = timedelta(0)


@dataclass(frozen=True)
class Span:
    """``count`` instances of ``pool`` from ``start`` to ``end`` (an empty span when end <= start)."""

    pool: Pool
    start: datetime
    end: datetime
    count: int


@dataclass(frozen=True)
class Amount:
    """Money of ``pool`` written at ``at`` (a charge or a credit: the row of its UTC day gets all of it)."""

    pool: Pool
    at: datetime
    amount: Decimal


@dataclass(frozen=True)
class Window:
    """The report's window: [start, end)."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class PlanDay:
    """One plan's instance-time in one pool and day: what it reserved, and what of that was used."""

    reserved: timedelta = NOTHING
    used: timedelta = NOTHING


def day_parts(start: datetime, end: datetime) -> Iterator[tuple[date, timedelta]]:
    """[start, end) cut at UTC midnights: the time it has in each UTC day it touches."""
    while start < end:
        cut = min(end, _next_midnight(start))
        yield start.astimezone(UTC).date(), cut - start
        start = cut


def instance_time(spans: Iterable[Span], window: Window) -> dict[PoolDay, timedelta]:
    """Each span's count times its time inside the window, added per pool and UTC day."""
    total: dict[PoolDay, timedelta] = defaultdict(lambda: NOTHING)
    for span in spans:
        for day, length in day_parts(max(span.start, window.start), min(span.end, window.end)):
            total[(span.pool, day)] += length * span.count
    return dict(total)


def amounts_per_day(amounts: Iterable[Amount], window: Window) -> dict[PoolDay, Decimal]:
    """Each amount whose instant is inside the window, added per pool and UTC day of that instant."""
    total: dict[PoolDay, Decimal] = defaultdict(Decimal)
    for amount in amounts:
        if window.start <= amount.at < window.end:
            total[(amount.pool, amount.at.astimezone(UTC).date())] += amount.amount
    return dict(total)


def plan_days(reserved: Iterable[Span], held: Iterable[Span], window: Window) -> dict[PoolDay, PlanDay]:
    """One plan's reserved and used instance-time per pool and UTC day within the window.

    ``reserved`` are its segments (each to its end, or to when a cancellation released it); ``held`` what
    its consumers held. Used is, at each instant of a pool, the lesser of the two counts: never more
    than reserved, and never more than held."""
    by_pool: dict[Pool, list[tuple[datetime, int, int]]] = defaultdict(list)
    for kind, spans in ((0, reserved), (1, held)):
        for span in spans:
            start, end = max(span.start, window.start), min(span.end, window.end)
            if start < end and span.count > 0:
                by_pool[span.pool] += [(start, kind, span.count), (end, kind, -span.count)]
    days: dict[PoolDay, PlanDay] = {}
    for pool, changes in by_pool.items():
        for piece_start, piece_end, counts in _steps(changes):
            for day, length in day_parts(piece_start, piece_end):
                before = days.get((pool, day), PlanDay())
                days[(pool, day)] = PlanDay(
                    before.reserved + length * counts[0], before.used + length * min(counts)
                )
    return days


def _steps(changes: list[tuple[datetime, int, int]]) -> Iterator[tuple[datetime, datetime, tuple[int, int]]]:
    """The pieces between consecutive instants where a count changes, each with its two counts
    (reserved, held) over it; pieces where nothing is reserved (so nothing is used) are left out."""
    counts = [0, 0]
    ordered = sorted(changes, key=lambda change: change[0])
    for index, (at, kind, delta) in enumerate(ordered):
        counts[kind] += delta
        following = ordered[index + 1][0] if index + 1 < len(ordered) else at
        if following > at and counts[0] > 0:
            yield at, following, (counts[0], counts[1])


def _next_midnight(moment: datetime) -> datetime:
    midnight = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + timedelta(days=1)


# The monthly books (`hyperplan usage --monthly`): each account's days folded into its months.


@dataclass(frozen=True)
class DayBooks:
    """What one account's day adds to its month: a usage row's figures (any pool), or a payment alone.

    ``used`` is the reserved time the plans' consumers used (never more than reserved, plan_days);
    ``credited`` every credit of the day (resales of returned capacity, lending to spot jobs); ``paid``
    what left the account that day (plans' and extensions' fees, on-demand and spot charges)."""

    account: str
    day: date
    reserved: timedelta = NOTHING
    used: timedelta = NOTHING
    lent: timedelta = NOTHING
    returned: timedelta = NOTHING
    refunded: Decimal = Decimal(0)
    credited: Decimal = Decimal(0)
    paid: Decimal = Decimal(0)


@dataclass(frozen=True)
class MonthBooks:
    """One account's UTC calendar month (``month``: its first day), inside the report's window."""

    account: str
    month: date
    reserved: timedelta = NOTHING
    used: timedelta = NOTHING
    lent: timedelta = NOTHING
    returned: timedelta = NOTHING
    refunded: Decimal = Decimal(0)
    credited: Decimal = Decimal(0)
    paid: Decimal = Decimal(0)

    @property
    def idle(self) -> timedelta:
        """Reserved time neither used nor lent; never below zero (a spot run still open is counted
        lent until now, and may overlap a consumer's claim recorded at the same instant)."""
        return max(NOTHING, self.reserved - self.used - self.lent)

    @property
    def net_cost(self) -> Decimal:
        """What the month cost the account: paid, less what was refunded and credited back."""
        return self.paid - self.refunded - self.credited

    def plus(self, day: DayBooks) -> MonthBooks:
        return MonthBooks(
            account=self.account,
            month=self.month,
            reserved=self.reserved + day.reserved,
            used=self.used + day.used,
            lent=self.lent + day.lent,
            returned=self.returned + day.returned,
            refunded=self.refunded + day.refunded,
            credited=self.credited + day.credited,
            paid=self.paid + day.paid,
        )


def month_of(day: date) -> date:
    """The first day of a day's calendar month: the key of its month."""
    return day.replace(day=1)


def months(days: Iterable[DayBooks]) -> list[MonthBooks]:
    """The days added up per account and calendar month, ordered by account, then month. Time stays in
    timedeltas until the reader divides it into hours, so a month's used never exceeds its reserved."""
    books: dict[tuple[str, date], MonthBooks] = {}
    for day in days:
        key = (day.account, month_of(day.day))
        books[key] = books.get(key, MonthBooks(*key)).plus(day)
    return [books[key] for key in sorted(books)]


def split(amount: Decimal, weights: list[Decimal], places: int) -> list[Decimal]:
    """``amount`` shared in proportion to ``weights`` (at least one of them positive), each share in the
    currency's minor unit, the shares adding up to exactly ``amount`` (each boundary of the running total
    is rounded down, so no unit is lost or made). A refund of a return that gave back windows of several
    pools is split so over their pools."""
    total = sum(weights, start=Decimal(0))
    unit = Decimal(1).scaleb(-places)
    shares, running, before = [], Decimal(0), Decimal(0)
    for index, weight in enumerate(weights):
        running += weight
        last = index == len(weights) - 1
        upto = amount if last else (amount * running / total).quantize(unit, rounding=ROUND_DOWN)
        shares.append(upto - before)
        before = upto
    return shares
