"""Prices beyond the list price (core/pricing.py): load-based multipliers and the resale discount, as a
search works them out from the calendar, and as an offering id carries them to the purchase."""

from __future__ import annotations

import struct
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from hyperplan.core import offering_ids
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import BookingPolicy, Fleet, LoadPricing
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.offering_ids import OfferingClaim, OfferingIdError, OfferingSegment
from hyperplan.core.pricing import DayLoad, multiplier, returned_share, segment_price
from hyperplan.core.returns import FLEXIBLE
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ValidationError

from .support import fleet as support_fleet
from .support import pool, utc

P5 = "ml.p5.48xlarge"
NOW = utc(2026, 3, 2, 11, 0)  # half an hour before a boundary: no partial day
DAY0 = utc(2026, 3, 2, 11, 30)
DAY = timedelta(days=1)
POOL_A = (P5, "us-west-2a")
LOAD = LoadPricing(load_based=True, low=Decimal("0.5"), high=Decimal("1.5"))


def fleet(pricing: LoadPricing = LoadPricing(), discount: str = "0") -> Fleet:
    earliest = BookingPolicy(ranking="earliest", allowed_counts=None, max_segments=1)
    return replace(
        support_fleet(pool("a", 8), policy=earliest),
        pricing=pricing,
        cancellation=replace(FLEXIBLE, resale_discount=Decimal(discount)),
    )


def one_day(count: int, first_day: int) -> SearchRequest:
    """``count`` p5s for one day, starting on ``first_day`` (days from DAY0), in a window of that day."""
    start = DAY0 + first_day * DAY
    return SearchRequest(P5, count, 24, "training-job", start, start + DAY)


def list_price(count: int, days: int = 1) -> Decimal:
    return Decimal("10.00") * count * 24 * days


# -- the rules ----------------------------------------------------------------------------------------


def test_without_either_setting_the_multiplier_is_one() -> None:
    busy = [DayLoad(held_share=1.0, free=0, returned=8)]
    assert multiplier(LoadPricing(), Decimal(0), busy, 4) == 1


def test_a_load_based_multiplier_runs_from_low_on_idle_days_to_high_on_full_ones() -> None:
    idle, half, full = DayLoad(0.0, 8, 0), DayLoad(0.5, 4, 0), DayLoad(1.0, 0, 0)
    assert multiplier(LOAD, Decimal(0), [idle], 1) == Decimal("0.5")
    assert multiplier(LOAD, Decimal(0), [half], 1) == Decimal("1.0")
    assert multiplier(LOAD, Decimal(0), [full], 1) == Decimal("1.5")
    assert multiplier(LOAD, Decimal(0), [idle, full], 1) == Decimal("1.0")  # the days' mean


def test_only_the_instance_days_the_pool_could_give_from_returned_capacity_are_discounted() -> None:
    # 4 free, all of them returned: a booking of 4 needs all 4; of 2, both.
    assert returned_share([DayLoad(0.5, 4, 4)], 4) == 1
    # 6 free, 2 of them returned: a booking of 4 needs none of them; of 6, two of its six.
    assert returned_share([DayLoad(0.25, 6, 2)], 4) == 0
    assert returned_share([DayLoad(0.25, 6, 2)], 6) == Decimal(2) / 6
    # Over two days, one needing returned capacity and one not: half the instance-days.
    assert returned_share([DayLoad(0.5, 4, 4), DayLoad(0.0, 8, 0)], 4) == Decimal("0.5")
    assert multiplier(LoadPricing(), Decimal("0.2"), [DayLoad(0.5, 4, 4)], 4) == Decimal("0.8")


def test_the_discount_multiplies_the_load_based_price() -> None:
    assert multiplier(LOAD, Decimal("0.2"), [DayLoad(0.5, 4, 4)], 4) == Decimal("0.8")  # 1.0 x 0.8
    assert multiplier(LOAD, Decimal("0.2"), [DayLoad(1.0, 4, 4)], 4) == Decimal("1.2")  # 1.5 x 0.8


def test_a_segment_costs_its_multiple_of_the_list_price_to_the_cent() -> None:
    p = pool("a", 8)
    assert segment_price(p, DAY0, DAY0 + DAY, 3, Decimal("0.7777")) == Decimal("559.94")  # 720 x 0.7777


# -- in a search --------------------------------------------------------------------------------------


def test_load_based_offerings_are_cheaper_on_quieter_days() -> None:
    calendar = CapacityCalendar(fleet().pools)
    calendar.book(POOL_A, DAY0 + 2 * DAY, DAY0 + 3 * DAY, 6)  # day 2: 6 of 8 held
    priced = fleet(LOAD)
    quiet = search(priced, calendar, one_day(2, 1), NOW)[0]
    busy = search(priced, calendar, one_day(2, 2), NOW)[0]
    assert (quiet.segments[0].multiplier, quiet.upfront_fee) == (Decimal("0.5"), list_price(2) / 2)
    assert busy.segments[0].multiplier == Decimal("1.25")  # 0.5 + 1.0 x 6/8
    assert busy.upfront_fee == list_price(2) * Decimal("1.25")
    # Off (the default), both cost the list price.
    assert search(fleet(), calendar, one_day(2, 2), NOW)[0].upfront_fee == list_price(2)


def test_an_offering_built_on_returned_capacity_is_discounted_and_one_beside_it_is_not() -> None:
    calendar = CapacityCalendar(fleet().pools)
    for day in (1, 2):
        calendar.book(POOL_A, DAY0 + day * DAY, DAY0 + (day + 1) * DAY, 8)
    calendar.release(POOL_A, DAY0 + DAY, DAY0 + 2 * DAY, 8)
    calendar.book(POOL_A, DAY0 + DAY, DAY0 + 2 * DAY, 4)
    calendar.mark_returned(POOL_A, DAY0 + 2 * DAY, DAY0 + 3 * DAY, 4)  # a plan gave back 4 of day 2
    calendar.release(POOL_A, DAY0 + 2 * DAY, DAY0 + 3 * DAY, 4)
    discounted = fleet(discount="0.25")
    on_returned = search(discounted, calendar, one_day(4, 2), NOW)[0]
    assert on_returned.segments[0].multiplier == Decimal("0.75")
    assert on_returned.upfront_fee == list_price(4) * Decimal("0.75")
    # Day 1 has 4 free of the pool's own: the same booking there pays the list price.
    assert search(discounted, calendar, one_day(4, 1), NOW)[0].upfront_fee == list_price(4)
    # Under a policy without a discount, returned capacity sells at the list price.
    assert search(fleet(), calendar, one_day(4, 2), NOW)[0].upfront_fee == list_price(4)


# -- carried by the offering id ------------------------------------------------------------------------

KEY = b"k" * 32


def claim(*multipliers: str) -> OfferingClaim:
    segments = tuple(
        OfferingSegment(0, DAY0 + 2 * i * DAY, DAY0 + (2 * i + 1) * DAY, Decimal(m))
        for i, m in enumerate(multipliers)
    )
    return OfferingClaim("123456789012", DAY0, "training-job", 4, segments)


def test_an_offering_id_carries_each_segments_multiplier() -> None:
    made = claim("0.5", "1.2345")
    assert (
        offering_ids.decode(offering_ids.encode(made, key=KEY, fleet=fleet()), key=KEY, fleet=fleet()) == made
    )


def test_a_multiplier_an_id_cannot_carry_is_refused_when_signing() -> None:
    with pytest.raises(ValueError, match="cannot be carried"):
        offering_ids.encode(claim("0.12345"), key=KEY, fleet=fleet())
    with pytest.raises(ValueError, match="cannot be carried"):
        offering_ids.encode(claim("7"), key=KEY, fleet=fleet())


def test_an_id_made_before_multipliers_reads_back_at_the_list_price() -> None:
    made = offering_ids.encode(claim("1"), key=KEY, fleet=fleet())
    raw = offering_ids._unpack_text(made)
    body = raw[: -offering_ids._MAC_BYTES]
    header = bytes([1]) + body[1 : offering_ids._HEADER.size]
    index, start, end, _ = offering_ids._SEGMENT.unpack_from(body, offering_ids._HEADER.size)
    old = header + struct.pack(">HII", index, start, end)
    old_id = offering_ids.PREFIX + offering_ids._base32([old + offering_ids._mac(KEY, old)])[0]
    assert offering_ids.decode(old_id, key=KEY, fleet=fleet()).segments[0].multiplier == 1


def test_another_spelling_of_the_same_bytes_is_refused() -> None:
    made = offering_ids.encode(claim("1"), key=KEY, fleet=fleet())
    text = made.removeprefix(offering_ids.PREFIX)
    raw = offering_ids._unpack_text(made)
    unused = len(text) * 5 - len(raw) * 8  # bits of the last character that carry nothing
    assert unused > 0
    last = "abcdefghijklmnopqrstuvwxyz234567".index(text[-1])
    respelled = offering_ids.PREFIX + text[:-1] + "abcdefghijklmnopqrstuvwxyz234567"[last | 1]
    assert respelled != made
    with pytest.raises(OfferingIdError, match="spelled"):
        offering_ids.decode(respelled, key=KEY, fleet=fleet())


# -- the fleet file -----------------------------------------------------------------------------------

BASE = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = []
[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2a"
count = 8
price_per_instance_hour = "10.00"
"""


def test_the_fleet_file_turns_load_based_prices_on_within_bounds() -> None:
    assert parse_fleet(BASE).pricing == LoadPricing()
    read = parse_fleet(BASE + "[pricing]\nload_based = true\nlow = 0.7\nhigh = 2\n").pricing
    assert read == LoadPricing(True, Decimal("0.7"), Decimal("2"))
    assert parse_fleet(
        BASE + '[cancellation]\npreset = "flexible"\nresale_discount = 0.3\n'
    ).cancellation == (replace(FLEXIBLE, resale_discount=Decimal("0.3")))


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("low = 0", "pricing.low"),
        ("low = 1.2", "pricing.low"),
        ("high = 0.9", "pricing.high"),
        ("high = 6", "pricing.high"),
        ('load_based = "yes"', "pricing.load_based"),
        ("surge = 2", "surge"),
    ],
)
def test_bad_pricing_is_refused_naming_the_key(table: str, named: str) -> None:
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")):
        parse_fleet(BASE + "[pricing]\n" + table + "\n")


def test_more_segments_than_an_offering_id_can_carry_are_refused() -> None:
    with pytest.raises(ValidationError, match="max_segments"):
        parse_fleet(BASE + "[policy]\nmax_segments = 11\n")
