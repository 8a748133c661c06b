"""The fleet file's ``[spot]`` table (core/fleet_spot.py): its defaults, its values, and its refusals."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from datetime import timedelta
from decimal import Decimal

import pytest

from hyperplan.core.fleet import SpotPolicy
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.errors import ValidationError
from tests.core.test_fleet import MINIMAL, demo_text


def spot_table(*lines: str) -> str:
    return MINIMAL + "[spot]\n" + "\n".join(lines) + "\n"


def refused(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(text)
    return caught.value.message


def test_a_fleet_without_the_table_takes_the_defaults() -> None:
    spot = parse_fleet(MINIMAL).spot
    assert spot == SpotPolicy()
    assert (spot.price_fraction, spot.lender_share, spot.prefer) == (Decimal("0.35"), Decimal("0.8"), "lent")
    assert (spot.notice, spot.max_notice) == (timedelta(seconds=120), timedelta(minutes=10))
    assert (spot.min_run, spot.stop_margin) == (timedelta(minutes=5), timedelta(minutes=15))
    assert spot.kill_grace == timedelta(seconds=10)
    assert parse_fleet(MINIMAL + "[spot]\n").spot == SpotPolicy()


def test_the_demo_fleet_shows_every_key_at_its_default() -> None:
    text = demo_text()
    written = tomllib.loads(text)["spot"]
    assert set(written) == {field.name for field in fields(SpotPolicy)}
    assert parse_fleet(text).spot == SpotPolicy()


def test_every_key_is_read() -> None:
    spot = parse_fleet(
        spot_table(
            'price_fraction = "0.5"',
            "lender_share = 0",
            'prefer = "on-demand"',
            'notice = "30m"',
            'max_notice = "1h"',
            'min_run = "0s"',
            'stop_margin = "7d"',
            'kill_grace = "5m"',
        )
    ).spot
    assert spot == SpotPolicy(
        price_fraction=Decimal("0.5"),
        lender_share=Decimal("0"),
        prefer="on-demand",
        notice=timedelta(minutes=30),
        max_notice=timedelta(hours=1),
        min_run=timedelta(0),
        stop_margin=timedelta(days=7),
        kill_grace=timedelta(minutes=5),
    )


def test_shares_are_exact_decimals_whether_written_as_numbers_or_text() -> None:
    assert parse_fleet(spot_table("price_fraction = 0.35")).spot.price_fraction == Decimal("0.35")
    assert parse_fleet(spot_table("price_fraction = 1")).spot.price_fraction == Decimal("1")
    assert parse_fleet(spot_table('lender_share = "0.75"')).spot.lender_share == Decimal("0.75")
    assert parse_fleet(spot_table("lender_share = 1.0")).spot.lender_share == Decimal("1.0")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (("grace = 1",), "spot.grace: unknown key (expected one of: price_fraction, lender_share"),
        (("price_fraction = 0",), "spot.price_fraction: 0 is not a share: more than 0, at most 1"),
        (("price_fraction = 1.5",), "spot.price_fraction: 1.5 is not a share: more than 0, at most 1"),
        (('price_fraction = "cheap"',), "spot.price_fraction: 'cheap' is not a share such as 0.35"),
        (('price_fraction = "nan"',), "spot.price_fraction: nan is not a share"),
        (("price_fraction = true",), "spot.price_fraction: True is not a share such as 0.35"),
        (("lender_share = -0.1",), "spot.lender_share: -0.1 is not a share: at least 0, at most 1"),
        (("lender_share = 2",), "spot.lender_share: 2 is not a share: at least 0, at most 1"),
        (('prefer = "spot"',), "spot.prefer: 'spot' is not one of lent, on-demand"),
        (("prefer = 1",), "spot.prefer: 1 is not a string"),
        (('notice = "0s"',), "spot.notice: 0s is shorter than 1s"),
        (('notice = "11m"',), "spot.notice: 11m is longer than max_notice, 10m"),
        (('notice = "5m"', 'stop_margin = "2m"'), "spot.stop_margin: 2m is shorter than notice, 5m"),
        (
            ('max_notice = "20m"', 'notice = "20m"'),
            "spot.stop_margin: 15m (the default) is shorter than notice, 20m",
        ),
        (('max_notice = "1m"',), "spot.notice: 2m (the default) is longer than max_notice, 1m"),
        (('max_notice = "1h1s"',), "spot.max_notice: 1h1s is longer than 1h"),
        (('max_notice = "0s"', 'notice = "0s"'), "spot.max_notice: 0s is shorter than 1s"),
        (('notice = "soon"',), "spot.notice: 'soon' is not a duration"),
        (("notice = 120",), 'spot.notice: 120 is not a duration string such as "30m"'),
        (('min_run = "7d1s"',), "spot.min_run: 7d1s is longer than 7d"),
        (('stop_margin = "8d"',), "spot.stop_margin: 8d is longer than 7d"),
        (('kill_grace = "6m"',), "spot.kill_grace: 6m is longer than 5m"),
    ],
)
def test_refusals_name_the_key(lines: tuple[str, ...], message: str) -> None:
    assert message in refused(spot_table(*lines))


def test_the_table_must_be_a_table() -> None:
    assert "spot: 'lent' is not a table" in refused(
        MINIMAL.replace('region = "us-west-2"', 'spot = "lent"\nregion = "us-west-2"')
    )
