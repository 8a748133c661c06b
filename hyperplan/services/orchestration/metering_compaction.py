"""On-demand metering's hourly ledger lines compacted, once older than the fleet's ``[retention]
metering`` period, into one line per holder and UTC day with the same total (docs/DECISIONS.md,
"Retention of rows").

Metering (services/clusters/metering.py) writes one ledger line per started instance-hour of each holder
(a cluster node, or one attempt of a training job without a plan: an `OnDemandMeter`), dated at the
hour's start. A node on demand for a year is 8,760 lines; this keeps 365. The lines carry no link to
their meter, so a holder's lines are found from the meter: its account, and for each hour the instant
(`hour_start`) and the words metering wrote. An hour matched by more than one line (two holders that
nothing tells apart) leaves that holder's day as it is: a total is never guessed.

The day's line sums the hours exactly (Decimal; amounts are kept as decimal text), is dated at the
day's first hour and carries the budget the last hour left. Per UTC day (what the usage report and the
monthly books count, services/plans/usage.py) nothing changes; a report window cut inside a compacted
day counts the day's line whole on the side of its first hour.

Days are compacted oldest first, each holder's day in one transaction with the others of its batch
(at most `BATCH_LINES` lines removed per transaction), and the store keeps the day up to which every
holder is done (`THROUGH`): a crash between batches leaves whole days and whole hours, and the next pass
starts again at the first day not done, where a holder already compacted has no hourly line left.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, or_, select

from hyperplan.core.metering import HOUR, hour_start
from hyperplan.errors import Conflict
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import settings as stored
from hyperplan.store.schema import LedgerEntry, OnDemandMeter

THROUGH = "retention.metering-through"  # UTC midnight: every holder's days before it compacted
BATCH_LINES = 1000  # hourly lines removed per transaction at most (whole holder-days)
DAY = timedelta(days=1)
HOURLY_PREFIX = "On-demand "


@dataclass(frozen=True)
class Meter:
    """What compaction needs of one `OnDemandMeter`: the words its hourly lines carry, and when."""

    account_id: str
    name: str
    count: int
    instance_type: str
    availability_zone: str
    price: Decimal
    currency: str
    started_at: datetime
    hours_charged: int

    def hourly_description(self, hour: int) -> str:
        """The words metering writes for one hour (services/clusters/metering.py `_charge`)."""
        return (
            f"On-demand {self.name}: {self.count} x {self.instance_type} in {self.availability_zone}, "
            f"hour {hour}, at {self.price} {self.currency} per instance-hour"
        )

    def day_description(self, first: int, last: int, hours: int, day: datetime) -> str:
        """The words of the line that replaces a day's hourly ones (no longer starting "On-demand ...:
        ... hour N": a later pass never takes it for an hourly line)."""
        return (
            f"On-demand {self.name}: {self.count} x {self.instance_type} in {self.availability_zone}, "
            f"{hours} hours ({first}-{last}) of {day:%Y-%m-%d}, at {self.price} {self.currency} per "
            "instance-hour"
        )

    def hours_in(self, day: datetime) -> range:
        """The charged hours whose start falls on this UTC day."""
        first = max(1, math.ceil((day - self.started_at) / HOUR) + 1)
        last = min(self.hours_charged, math.ceil((day + DAY - self.started_at) / HOUR))
        return range(first, last + 1)


@dataclass(frozen=True)
class Line:
    id: int
    at: datetime
    amount: Decimal
    budget_after: Decimal


@dataclass(frozen=True)
class HolderDay:
    """One holder's hourly lines of one day, and the line that replaces them."""

    lines: tuple[Line, ...]
    replacement: LedgerEntry


@dataclass(frozen=True)
class Compacted:
    hourly_lines: int = 0  # removed
    day_lines: int = 0  # written in their place


def midnight(when: datetime) -> datetime:
    when = when.astimezone(UTC)
    return datetime(when.year, when.month, when.day, tzinfo=UTC)


def compact(runtime: ServiceContext, period: timedelta, stopping: Callable[[], bool]) -> Compacted:
    """Compact every day that ended `period` or more ago and is not done yet; stop early (between two
    days' batches) when `stopping` says so."""
    until = midnight(runtime.clock.now() - period)
    since = _first_day(runtime, until)
    if since is None:
        return Compacted()
    meters = _meters(runtime, since, until)
    removed = written = 0
    day = since
    while day < until and not stopping():
        for batch in _batches(_holder_days(runtime, meters, day)):
            _replace(runtime, batch)
            removed += sum(len(h.lines) for h in batch)
            written += len(batch)
        day += DAY
        with runtime.db.write() as session:
            stored.put_time(session, THROUGH, day)
    return Compacted(removed, written)


def _first_day(runtime: ServiceContext, until: datetime) -> datetime | None:
    """The first day not compacted yet (None: none to do): the stored one, else the first meter's."""
    with runtime.db.read() as session:
        since = stored.get_time(session, THROUGH)
        if since is None:
            first_start = session.scalar(select(func.min(OnDemandMeter.started_at)))
            since = None if first_start is None else midnight(first_start)
    return since if since is not None and since < until else None


def _meters(runtime: ServiceContext, since: datetime, until: datetime) -> list[Meter]:
    """The meters that charged hours between `since` and `until`."""
    with runtime.db.read() as session:
        rows = session.scalars(
            select(OnDemandMeter).where(
                OnDemandMeter.started_at < until,
                or_(OnDemandMeter.ended_at.is_(None), OnDemandMeter.ended_at >= since),
                OnDemandMeter.hours_charged > 1,
            )
        )
        return [
            Meter(
                m.account_id,
                m.name,
                m.count,
                m.instance_type,
                m.availability_zone,
                m.price_per_instance_hour,
                m.currency,
                m.started_at,
                m.hours_charged,
            )
            for m in rows
        ]


LineKey = tuple[str, datetime, str]  # account, instant, words


def _holder_days(runtime: ServiceContext, meters: Sequence[Meter], day: datetime) -> list[HolderDay]:
    """Each holder's hourly lines of `day` (two or more: one is already one line a day) and their
    replacement."""
    todays = [(meter, hours) for meter in meters if len(hours := meter.hours_in(day)) >= 2]
    if not todays:
        return []
    lines = _hourly_lines(runtime, day)
    found = []
    for meter, hours in todays:
        matched = {h: lines.get(_key(meter, h), []) for h in hours}
        if any(len(of_hour) > 1 for of_hour in matched.values()):
            continue  # two holders' lines cannot be told apart: both left hourly
        mine = {h: of_hour[0] for h, of_hour in matched.items() if of_hour}
        if len(mine) >= 2:
            found.append(HolderDay(tuple(mine.values()), _day_line(meter, mine, day)))
    return found


def _key(meter: Meter, hour: int) -> LineKey:
    return meter.account_id, hour_start(meter.started_at, hour), meter.hourly_description(hour)


def _hourly_lines(runtime: ServiceContext, day: datetime) -> dict[LineKey, list[Line]]:
    """Every on-demand ledger line dated on `day`, by account, instant and words."""
    with runtime.db.read() as session:
        rows = session.execute(
            select(
                LedgerEntry.id,
                LedgerEntry.account_id,
                LedgerEntry.at,
                LedgerEntry.amount,
                LedgerEntry.budget_after,
                LedgerEntry.description,
            ).where(
                LedgerEntry.at >= day,
                LedgerEntry.at < day + DAY,
                LedgerEntry.invoice_id.is_(None),
                LedgerEntry.description.startswith(HOURLY_PREFIX, autoescape=True),
            )
        )
        by_key: dict[LineKey, list[Line]] = defaultdict(list)
        for row in rows:
            by_key[(row.account_id, row.at, row.description)].append(
                Line(row.id, row.at, row.amount, row.budget_after)
            )
        return by_key


def _day_line(meter: Meter, lines: Mapping[int, Line], day: datetime) -> LedgerEntry:
    """One line for the holder's day (`lines` by hour): the hours' exact sum, dated at the first hour,
    with the budget the last one left."""
    first, last = min(lines), max(lines)
    return LedgerEntry(
        account_id=meter.account_id,
        invoice_id=None,
        at=lines[first].at,
        amount=sum((line.amount for line in lines.values()), start=Decimal("0")),
        budget_after=lines[last].budget_after,
        description=meter.day_description(first, last, len(lines), day),
    )


def _batches(holder_days: Iterable[HolderDay]) -> Iterable[list[HolderDay]]:
    """Whole holder-days, at most BATCH_LINES hourly lines a batch (one holder-day may be more)."""
    batch: list[HolderDay] = []
    size = 0
    for holder_day in holder_days:
        if batch and size + len(holder_day.lines) > BATCH_LINES:
            yield batch
            batch, size = [], 0
        batch.append(holder_day)
        size += len(holder_day.lines)
    if batch:
        yield batch


def _replace(runtime: ServiceContext, batch: Sequence[HolderDay]) -> None:
    """One transaction: the day lines in, the hourly ones out, all or nothing."""
    ids = [line.id for holder_day in batch for line in holder_day.lines]
    with runtime.db.write() as session:
        result = session.execute(delete(LedgerEntry).where(LedgerEntry.id.in_(ids)))
        gone = cast(CursorResult[Any], result).rowcount
        if gone != len(ids):  # another pass got there first: this batch changes nothing
            raise Conflict(f"{len(ids) - gone} of {len(ids)} hourly ledger lines were already gone")
        session.add_all([holder_day.replacement for holder_day in batch])
