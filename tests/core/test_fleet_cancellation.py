"""The fleet file's ``[cancellation]`` table and a pool's own policy (core/fleet_cancellation.py): the
defaults, the presets, tiers, the refusals (each naming its key), and which policy a pool follows."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.returns import FLEXIBLE, STRICT, CancellationPolicy, RefundTier
from hyperplan.errors import ValidationError
from tests.core.test_fleet import MINIMAL, demo_text

P5 = "ml.p5.48xlarge"


def cancellation_table(*lines: str) -> str:
    return MINIMAL + "[cancellation]\n" + "\n".join(lines) + "\n"


def with_pool_line(line: str, pool_index: int = 0) -> str:
    """MINIMAL with ``line`` added to its ``pool_index``-th ``[[pools]]`` entry."""
    parts = MINIMAL.split("[[pools]]\n")
    parts[pool_index + 1] = line + "\n" + parts[pool_index + 1]
    return "[[pools]]\n".join(parts)


def refused(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(text)
    return caught.value.message


def test_a_fleet_without_the_table_allows_no_returns() -> None:
    fleet = parse_fleet(MINIMAL)
    assert fleet.cancellation == STRICT
    assert not fleet.cancellation.allows_returns
    assert fleet.cancellation_for(P5, "us-west-2a") == STRICT
    assert parse_fleet(MINIMAL + "[cancellation]\n").cancellation == STRICT


def test_the_presets() -> None:
    assert parse_fleet(cancellation_table('preset = "strict"')).cancellation == STRICT
    flexible = parse_fleet(cancellation_table('preset = "flexible"')).cancellation
    assert flexible == FLEXIBLE
    assert flexible.tiers == (
        RefundTier(timedelta(days=7), Decimal(1)),
        RefundTier(timedelta(0), Decimal("0.5")),
    )
    assert (flexible.resale_share, flexible.quote_validity) == (Decimal("0.5"), timedelta(minutes=10))
    assert flexible.refund_cap is None


def test_the_demo_fleet_is_flexible_in_every_pool() -> None:
    fleet = parse_fleet(demo_text())
    demo = replace(FLEXIBLE, resale_discount=Decimal("0.2"))  # and offers returned capacity 20% off
    assert fleet.cancellation == demo
    assert all(fleet.cancellation_for(*pool.key) == demo for pool in fleet.pools)


def test_keys_change_a_preset_and_keep_its_name() -> None:
    policy = parse_fleet(
        cancellation_table(
            'preset = "flexible"',
            "resale_share = 0.35",
            'quote_validity = "5m"',
            'refund_cap = "50000"',
            'cap_period = "365d"',
        )
    ).cancellation
    assert policy == CancellationPolicy(
        name="flexible",
        tiers=FLEXIBLE.tiers,
        resale_share=Decimal("0.35"),
        quote_validity=timedelta(minutes=5),
        refund_cap=Decimal(50000),
        cap_period=timedelta(days=365),
    )


def test_tiers_of_ones_own_are_custom_and_sorted_farthest_first() -> None:
    policy = parse_fleet(
        cancellation_table(
            'tiers = [{before = "0s", refund = 0.35}, {before = "14d", refund = 1}, '
            '{before = "2d", refund = "0.75"}]'
        )
    ).cancellation
    assert policy.name == "custom"
    assert policy.tiers == (
        RefundTier(timedelta(days=14), Decimal(1)),
        RefundTier(timedelta(days=2), Decimal("0.75")),
        RefundTier(timedelta(0), Decimal("0.35")),
    )
    assert policy.resale_share == Decimal(0)  # strict's, the base without a preset
    assert policy.allows_returns


def test_tiers_over_a_preset_keep_its_other_values() -> None:
    policy = parse_fleet(
        cancellation_table('preset = "flexible"', 'tiers = [{before = "1d", refund = 1.0}]')
    ).cancellation
    assert (policy.name, policy.tiers) == ("custom", (RefundTier(timedelta(days=1), Decimal("1.0")),))
    assert policy.resale_share == FLEXIBLE.resale_share


def test_an_empty_list_of_tiers_allows_no_returns() -> None:
    policy = parse_fleet(cancellation_table('preset = "flexible"', "tiers = []")).cancellation
    assert not policy.allows_returns


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (("refunds = 1",), "cancellation.refunds: unknown key (expected one of: preset, tiers,"),
        (
            ('preset = "lenient"',),
            "cancellation.preset: 'lenient' is not a preset (one of: strict, flexible)",
        ),
        (("preset = 1",), "cancellation.preset: 1 is not a string"),
        (("tiers = 1",), "cancellation.tiers: 1 is not an array of tables"),
        (("tiers = [{refund = 1.0}]",), "cancellation.tiers[0].before: required"),
        (('tiers = [{before = "1d"}]',), "cancellation.tiers[0].refund: required"),
        (
            ('tiers = [{before = "1d", refund = 1.0, after = "2d"}]',),
            "cancellation.tiers[0].after: unknown key (expected one of: before, refund)",
        ),
        (
            ('tiers = [{before = "1d", refund = 1.0}, {before = "0s", refund = 1.5}]',),
            "cancellation.tiers[1].refund: 1.5 is not a share: more than 0, at most 1",
        ),
        (('tiers = [{before = "1d", refund = 0}]',), "cancellation.tiers[0].refund: 0 is not a share"),
        (
            ('tiers = [{before = "1d", refund = "half"}]',),
            "cancellation.tiers[0].refund: 'half' is not a share",
        ),
        (
            ('tiers = [{before = "soon", refund = 1}]',),
            "cancellation.tiers[0].before: 'soon' is not a duration",
        ),
        (("tiers = [{before = 7, refund = 1}]",), "cancellation.tiers[0].before: 7 is not a duration string"),
        (
            ('tiers = [{before = "2d", refund = 1}, {before = "48h", refund = 0.5}]',),
            "cancellation.tiers: two tiers start 2d before; one would do",
        ),
        (
            ('tiers = [{before = "7d", refund = 0.5}, {before = "0s", refund = 1}]',),
            "cancellation.tiers: the tier 0s before refunds more than the one 7d before",
        ),
        (("resale_share = 1.5",), "cancellation.resale_share: 1.5 is not a share: at least 0, at most 1"),
        (("resale_share = -0.1",), "cancellation.resale_share: -0.1 is not a share"),
        (('quote_validity = "0s"',), "cancellation.quote_validity: 0s is not longer than nothing"),
        (('quote_validity = "2d"',), "cancellation.quote_validity: 2d is longer than 1d"),
        (("quote_validity = 600",), "cancellation.quote_validity: 600 is not a duration string"),
        (('cap_period = "0s"',), "cancellation.cap_period: 0s is not longer than nothing"),
        (('refund_cap = "-5"',), 'cancellation.refund_cap: -5 is not a positive amount (or "none")'),
        (('refund_cap = "lots"',), "cancellation.refund_cap: 'lots' is not an amount such as \"50000\""),
        (("refund_cap = true",), "cancellation.refund_cap: True is not an amount"),
    ],
)
def test_a_wrong_value_is_refused_by_its_key(lines: tuple[str, ...], message: str) -> None:
    assert refused(cancellation_table(*lines)).startswith(message)


def test_a_refund_cap_reads_exactly_from_a_number_too() -> None:
    assert parse_fleet(cancellation_table("refund_cap = 1000.10")).cancellation.refund_cap == Decimal(
        "1000.10"
    )


def test_a_pool_may_name_a_preset_of_its_own() -> None:
    fleet = parse_fleet(
        with_pool_line('cancellation = "flexible"', 1).replace(
            "[[zones]]", '[cancellation]\npreset = "strict"\n[[zones]]', 1
        )
    )
    assert fleet.cancellation == STRICT
    assert fleet.cancellation_for(P5, "us-west-2b") == FLEXIBLE
    assert fleet.cancellation_for(P5, "us-west-2a") == STRICT
    assert fleet.pools[1].cancellation == FLEXIBLE
    assert fleet.pools[0].cancellation is None


def test_a_strict_pool_in_a_flexible_fleet() -> None:
    fleet = parse_fleet(with_pool_line('cancellation = "strict"') + '[cancellation]\npreset = "flexible"\n')
    assert fleet.cancellation_for(P5, "us-west-2a") == STRICT
    assert fleet.cancellation_for(P5, "us-west-2b") == FLEXIBLE


def test_a_pool_may_have_a_table_of_its_own() -> None:
    fleet = parse_fleet(
        with_pool_line('cancellation = {preset = "flexible", refund_cap = "1000", cap_period = "7d"}')
    )
    own = fleet.cancellation_for(P5, "us-west-2a")
    assert (own.name, own.tiers, own.refund_cap, own.cap_period) == (
        "flexible",
        FLEXIBLE.tiers,
        Decimal(1000),
        timedelta(days=7),
    )


def test_a_pool_table_can_lift_the_fleets_cap() -> None:
    fleet = parse_fleet(
        with_pool_line('cancellation = {preset = "flexible", refund_cap = "none"}')
        + '[cancellation]\npreset = "flexible"\nrefund_cap = "10"\n'
    )
    assert fleet.cancellation_for(P5, "us-west-2a").refund_cap is None
    assert fleet.cancellation_for(P5, "us-west-2b").refund_cap == Decimal(10)


def test_a_pool_the_fleet_no_longer_has_follows_the_fleet() -> None:
    fleet = parse_fleet(cancellation_table('preset = "flexible"'))
    assert fleet.cancellation_for("ml.p4d.24xlarge", "us-west-2a") == FLEXIBLE


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            'cancellation = "lenient"',
            "pools[0].cancellation: 'lenient' is not a preset (one of: strict, flexible)",
        ),
        ("cancellation = 1", "pools[0].cancellation: 1 is not a preset"),
        (
            'cancellation = {tiers = [{before = "1d", refund = 2}]}',
            "pools[0].cancellation.tiers[0].refund: 2 is not a share",
        ),
        ("cancellation = {refund = 1}", "pools[0].cancellation.refund: unknown key"),
    ],
)
def test_a_pools_wrong_policy_is_refused_by_its_key(line: str, message: str) -> None:
    assert refused(with_pool_line(line)).startswith(message)
