from datetime import time, timedelta
from decimal import Decimal
from importlib import resources

import pytest

from hyperplan.core.fleet import (
    BackgroundLoad,
    BookingPolicy,
    DirectoryBucket,
    Quotas,
    S3Bucket,
)
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.errors import ValidationError

MINIMAL = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-0a1b2c3d4e5f60001"]
[[zones]]
name = "us-west-2b"
zone_id = "usw2-az2"
[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2a"
count = 16
price_per_instance_hour = "55.04"
[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2b"
count = 16
reservable = 8
price_per_instance_hour = 55.04
[[pools]]
instance_type = "ml.m5.12xlarge"
zone = "us-west-2b"
count = 4
reservable = 0
price_per_instance_hour = "2.765"
"""


def demo_text() -> str:
    return resources.files("hyperplan.fleet").joinpath("demo.toml").read_text()


def refused(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(text)
    return caught.value.message


# -- what a fleet holds -----------------------------------------------------------------------------


def test_minimal_fleet_takes_the_defaults() -> None:
    fleet = parse_fleet(MINIMAL)
    assert fleet.region == "us-west-2"
    assert fleet.policy == BookingPolicy()
    assert fleet.quotas == Quotas()
    assert fleet.background_load is None
    assert dict(fleet.buckets) == {}
    assert fleet.default_payment_mode == "auto"
    first = fleet.pools[0]
    assert (first.instance_count, first.reservable, first.on_demand, first.currency) == (16, 16, 0, "USD")
    assert fleet.pools[1].on_demand == 8


def test_policy_defaults_follow_aws() -> None:
    policy = BookingPolicy()
    assert policy.lead_time == timedelta(minutes=30)
    assert policy.horizon == timedelta(days=56)
    assert policy.segment_end == time(11, 30)
    assert (policy.min_days, policy.max_days) == (1, 182)
    assert policy.allowed_counts == (1, 2, 4, 8, 16, 32, 64)
    assert (policy.max_segments, policy.max_offerings) == (2, 3)
    assert policy.offering_validity == timedelta(minutes=30)
    assert policy.ranking == "packing"  # ours; "earliest" is AWS's order (docs/PLANNING.md)
    assert parse_fleet(MINIMAL + '[policy]\nranking = "earliest"\n').policy.ranking == "earliest"
    assert policy.reclaim_lead_for("training-job") == timedelta(minutes=30)
    assert policy.reclaim_lead_for("hyperpod-cluster") == timedelta(minutes=30)


def test_a_number_price_is_read_through_its_text() -> None:
    assert parse_fleet(MINIMAL).pools[1].price_per_instance_hour == Decimal("55.04")
    text = MINIMAL.replace("price_per_instance_hour = 55.04", "price_per_instance_hour = 98.32")
    assert str(parse_fleet(text).pools[1].price_per_instance_hour) == "98.32"


def test_the_on_demand_price_is_the_pools_price_unless_given() -> None:
    assert parse_fleet(MINIMAL).pools[1].on_demand_price_per_instance_hour == Decimal("55.04")
    text = MINIMAL.replace(
        "price_per_instance_hour = 55.04",
        'price_per_instance_hour = 55.04\non_demand_price_per_instance_hour = "70.5"',
    )
    assert parse_fleet(text).pools[1].on_demand_price_per_instance_hour == Decimal("70.5")


def test_lookups() -> None:
    fleet = parse_fleet(MINIMAL)
    assert [p.availability_zone for p in fleet.pools_of_type("ml.p5.48xlarge")] == [
        "us-west-2a",
        "us-west-2b",
    ]
    assert fleet.pools_of_type("ml.p4d.24xlarge") == ()
    assert fleet.pool(("ml.m5.12xlarge", "us-west-2b")).reservable == 0
    with pytest.raises(KeyError):
        fleet.pool(("ml.m5.12xlarge", "us-west-2a"))
    assert fleet.zone_of_subnet("subnet-0a1b2c3d4e5f60001") == fleet.zones[0]
    assert fleet.zone_of_subnet("subnet-ffffffff") is None
    assert fleet.zone("us-west-2b") == fleet.zones[1]
    assert fleet.zone("us-west-2z") is None
    assert fleet.reservable_types() == ("ml.p5.48xlarge",)


def test_fingerprint_is_four_stable_bytes_that_follow_pools_prices_and_policy() -> None:
    base = parse_fleet(MINIMAL).fingerprint()
    assert len(base) == 4
    assert parse_fleet(MINIMAL).fingerprint() == base
    assert parse_fleet(MINIMAL.replace('"55.04"', '"55.040"')).fingerprint() == base  # same amount
    assert parse_fleet(MINIMAL.replace('"55.04"', '"55.05"')).fingerprint() != base
    assert parse_fleet(MINIMAL.replace("reservable = 8", "reservable = 7")).fingerprint() != base
    assert parse_fleet(MINIMAL + '[policy]\nlead_time = "1h"\n').fingerprint() != base
    assert parse_fleet(MINIMAL + "[policy]\nmax_segments = 3\n").fingerprint() != base
    assert parse_fleet(MINIMAL + '[buckets]\n"data-1" = "/srv/d"\n').fingerprint() == base


def test_fingerprint_follows_pool_order_because_offering_ids_name_pools_by_index() -> None:
    fleet = parse_fleet(MINIMAL)
    reordered = type(fleet)(fleet.region, fleet.zones, tuple(reversed(fleet.pools)), fleet.policy)
    assert reordered.fingerprint() != fleet.fingerprint()


def test_every_optional_table() -> None:
    text = (
        MINIMAL
        + """
[policy]
lead_time = "1h"
horizon = "28d"
segment_end = "00:00"
min_days = 2
max_days = 30
allowed_counts = "any"
max_segments = 3
max_offerings = 5
offering_validity = "2h"
[policy.reclaim_lead]
hyperpod-cluster = "1h"
[background_load]
cycle_days = 10
quiet_days = [3, 4]
quiet_booked = [0.25, 0.5]
busy_booked = [0.9, 1]
seed = 7
[quotas]
max_active_plans = 5
max_on_demand_instances_per_type = 3
max_on_demand_share_per_type = 0.5
[buckets]
"team-data" = "/srv/data"
[accounts]
default_payment_mode = "approval"
"""
    )
    fleet = parse_fleet(text)
    assert fleet.policy.lead_time == timedelta(hours=1)
    assert fleet.policy.horizon == timedelta(days=28)
    assert fleet.policy.segment_end == time(0, 0)
    assert fleet.policy.allowed_counts is None
    assert (fleet.policy.min_days, fleet.policy.max_days, fleet.policy.max_segments) == (2, 30, 3)
    assert fleet.policy.reclaim_lead_for("hyperpod-cluster") == timedelta(hours=1)
    assert fleet.policy.reclaim_lead_for("training-job") == timedelta(minutes=30)
    assert fleet.background_load == BackgroundLoad(10, (3, 4), (0.25, 0.5), (0.9, 1.0), 7)
    assert fleet.quotas == Quotas(
        max_active_plans=5, max_on_demand_instances_per_type=3, max_on_demand_share_per_type=0.5
    )
    assert dict(fleet.buckets) == {"team-data": DirectoryBucket("/srv/data")}
    assert fleet.default_payment_mode == "approval"
    assert parse_fleet(MINIMAL + "[policy]\nsegment_end = 11:30:00\n").policy.segment_end == time(11, 30)
    assert parse_fleet(MINIMAL + "[policy]\nallowed_counts = [4, 1, 2]\n").policy.allowed_counts == (1, 2, 4)


def test_the_demo_fleet() -> None:
    fleet = parse_fleet(demo_text())
    assert fleet.region == "us-west-2"
    assert [z.name for z in fleet.zones] == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert [z.zone_id for z in fleet.zones] == ["usw2-az1", "usw2-az2", "usw2-az3"]
    assert all(len(zone.subnets) >= 2 for zone in fleet.zones)
    assert fleet.reservable_types() == (
        "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.trn2.48xlarge",
    )  # fmt: skip
    controllers = fleet.pools_of_type("ml.m5.12xlarge")
    assert {p.availability_zone for p in controllers} == {z.name for z in fleet.zones}
    assert all(p.reservable == 0 for p in controllers)
    assert fleet.pool(("ml.p5.48xlarge", "us-west-2a")).price_per_instance_hour == Decimal("55.04")
    assert fleet.policy == BookingPolicy()
    assert fleet.background_load == BackgroundLoad()
    assert fleet.default_payment_mode == "auto"


# -- what a fleet file may not say ------------------------------------------------------------------


def pool_line(index: int, old: str, new: str) -> str:
    """MINIMAL with ``old`` replaced by ``new`` in pools[index] only."""
    head, *pools = MINIMAL.split("[[pools]]")
    pools[index] = pools[index].replace(old, new)
    return "[[pools]]".join([head, *pools])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            pool_line(1, "reservable = 8", "reservable = 20"),
            "pools[1].reservable: 20 is more than the pool's count, 16",
        ),
        (pool_line(0, "count = 16", "count = 16\nreservabel = 3"), "pools[0].reservabel: unknown key"),
        (
            pool_line(0, '"us-west-2a"', '"us-west-2c"'),
            "pools[0].zone: 'us-west-2c' is not declared in [[zones]]",
        ),
        (pool_line(0, '"55.04"', '"0"'), "pools[0].price_per_instance_hour: 0 is not a positive amount"),
        (
            pool_line(0, '"55.04"', '"-1.5"'),
            "pools[0].price_per_instance_hour: -1.5 is not a positive amount",
        ),
        (pool_line(0, '"55.04"', '"cheap"'), "pools[0].price_per_instance_hour: 'cheap' is not an amount"),
        (pool_line(0, '"55.04"', '"NaN"'), "pools[0].price_per_instance_hour: NaN is not a positive amount"),
        (pool_line(0, '"55.04"', "true"), "pools[0].price_per_instance_hour: True is not an amount"),
        (pool_line(0, "count = 16", "count = 0"), "pools[0].count: 0 is less than 1"),
        (pool_line(0, "count = 16", "count = true"), "pools[0].count: True is not a whole number"),
        (pool_line(0, "count = 16", 'count = "16"'), "pools[0].count: '16' is not a whole number"),
        (pool_line(1, "reservable = 8", "reservable = -1"), "pools[1].reservable: -1 is less than 0"),
        (
            pool_line(0, '"55.04"', '"55.04"\ncurrency = "usd"'),
            "pools[0].currency: 'usd' is not a valid currency",
        ),
        (pool_line(2, '"2.765"', '"2.765"\ncurrency = "EUR"'), "pools[2].currency: EUR differs from USD"),
        (pool_line(1, "us-west-2b", "us-west-2a"), "pools[1]: same instance_type and zone as pools[0]"),
        (
            pool_line(0, '"ml.p5.48xlarge"', '"p5.48xlarge"'),
            "pools[0].instance_type: 'p5.48xlarge' is not a valid instance type (such as ml.p5.48xlarge)",
        ),
        (pool_line(0, 'zone = "us-west-2a"\n', ""), "pools[0].zone: required"),
        (
            MINIMAL.replace('region = "us-west-2"', 'region = "US West"'),
            "region: 'US West' is not a valid region",
        ),
        (MINIMAL.replace('region = "us-west-2"', ""), "region: required"),
        (
            MINIMAL.replace('region = "us-west-2"', 'region = "us-east-1"'),
            "zones[0].name: 'us-west-2a' is not a zone",
        ),
        (MINIMAL.replace('"usw2-az2"', '"usw2-az1"'), "zones[1]: same zone_id as zones[0]"),
        (
            MINIMAL.replace('"subnet-0a1b2c3d4e5f60001"', '"sub-1"'),
            "zones[0].subnets[0]: 'sub-1' is not a subnet id",
        ),
        (
            MINIMAL.replace(
                'zone_id = "usw2-az2"', 'zone_id = "usw2-az2"\nsubnets = ["subnet-0a1b2c3d4e5f60001"]'
            ),
            "zones: subnet subnet-0a1b2c3d4e5f60001 is declared more than once",
        ),
        ('region = "us-west-2"\n', "zones: a fleet needs at least one [[zones]] entry"),
        (MINIMAL.split("[[pools]]")[0], "pools: a fleet needs at least one [[pools]] entry"),
        ("colour = 1\n" + MINIMAL, "colour: unknown key (expected one of: region, currency"),
        (MINIMAL + "[policy]\nlead_time = 30\n", "policy.lead_time: 30 is not a duration string"),
        (
            MINIMAL + '[policy]\nlead_time = "half an hour"\n',
            "policy.lead_time: 'half an hour' is not a duration",
        ),
        (MINIMAL + '[policy]\nhorizon = "10m"\n', "policy.horizon: 10m is not later than the lead time"),
        (
            MINIMAL + '[policy]\nsegment_end = "11:45"\n',
            "policy.segment_end: 11:45:00 is not on the hour or half",
        ),
        (MINIMAL + '[policy]\nsegment_end = "25:00"\n', "policy.segment_end: '25:00' is not a time of day"),
        (MINIMAL + "[policy]\nmin_days = 5\nmax_days = 4\n", "policy.max_days: 4 is less than 5"),
        (
            MINIMAL + "[policy]\nallowed_counts = [1, 0]\n",
            "policy.allowed_counts[1]: 0 is not a positive whole",
        ),
        (
            MINIMAL + '[policy]\nallowed_counts = "all"\n',
            "policy.allowed_counts: 'all' is not a list of counts",
        ),
        (MINIMAL + "[policy]\nmax_segments = 0\n", "policy.max_segments: 0 is less than 1"),
        (MINIMAL + '[policy.reclaim_lead]\nendpoint = "1h"\n', "policy.reclaim_lead.endpoint: unknown key"),
        (
            MINIMAL + "[background_load]\nquiet_days = [5, 12]\n",
            "background_load.quiet_days: [5, 12] must lie",
        ),
        (
            MINIMAL + "[background_load]\nquiet_booked = [0.5, 1.5]\n",
            "background_load.quiet_booked: [0.5, 1.5]",
        ),
        (
            MINIMAL + "[background_load]\nbusy_booked = [0.9, 0.8]\n",
            "background_load.busy_booked: 0.9 is more",
        ),
        (MINIMAL + "[background_load]\nspeed = 1\n", "background_load.speed: unknown key"),
        (MINIMAL + "[quotas]\nmax_active_plans = 0\n", "quotas.max_active_plans: 0 is less than 1"),
        (
            MINIMAL + "[quotas]\nmax_on_demand_share_per_type = 2\n",
            "quotas.max_on_demand_share_per_type: 2 is not",
        ),
        (MINIMAL + '[buckets]\n"B" = "/srv"\n', "buckets.B: not a valid bucket name"),
        (MINIMAL + '[buckets]\n"data-1" = ""\n', "buckets.data-1: '' is not a directory"),
        (
            MINIMAL + '[accounts]\ndefault_payment_mode = "free"\n',
            "accounts.default_payment_mode: 'free' is not",
        ),
        (MINIMAL + '[policy]\nranking = "best"\n', "policy.ranking: 'best' is not one of packing, earliest"),
        ("policy = 3\n" + MINIMAL, "policy: 3 is not a table"),
        (MINIMAL + "[[policy]]\n", "policy: [{}] is not a table"),
        ("region = ", "the fleet file is not valid TOML"),
    ],
)
def test_refusals_name_the_key(text: str, message: str) -> None:
    assert refused(text).startswith(message)


# -- buckets on S3-compatible endpoints -------------------------------------------------------------


def test_a_bucket_may_be_a_directory_or_an_s3_compatible_endpoint() -> None:
    fleet = parse_fleet(
        MINIMAL
        + """
[buckets]
"local-data" = "/srv/data"

[buckets.team-data]
endpoint_url = "http://127.0.0.1:9000"
region = "eu-central-1"
bucket = "remote-name"
access_key_id_env = "TEAM_DATA_KEY_ID"
secret_access_key_env = "TEAM_DATA_SECRET"

[buckets.inline-keys]
endpoint_url = "https://s3.example.org/storage"
access_key_id = "AKIDEXAMPLE"
secret_access_key = "wJalrXUtnFEMI"

[buckets.aws-chain]
endpoint_url = "https://s3.us-east-1.amazonaws.com"
"""
    )
    assert dict(fleet.buckets) == {
        "local-data": DirectoryBucket("/srv/data"),
        "team-data": S3Bucket(
            "http://127.0.0.1:9000",
            "eu-central-1",
            "remote-name",
            access_key_id_env="TEAM_DATA_KEY_ID",
            secret_access_key_env="TEAM_DATA_SECRET",
        ),
        "inline-keys": S3Bucket(
            "https://s3.example.org/storage",
            "us-east-1",
            "inline-keys",
            access_key_id="AKIDEXAMPLE",
            secret_access_key="wJalrXUtnFEMI",
        ),
        "aws-chain": S3Bucket("https://s3.us-east-1.amazonaws.com", "us-east-1", "aws-chain"),
    }
    # The secret never shows in a repr, so a logged fleet does not leak it.
    assert "wJalrXUtnFEMI" not in repr(fleet.buckets["inline-keys"])


def test_half_a_key_pair_may_come_from_each_place() -> None:
    table = '[buckets.b-3]\nendpoint_url = "http://h:1"\naccess_key_id = "AKID"\n'
    bucket = parse_fleet(MINIMAL + table + 'secret_access_key_env = "S"\n').buckets["b-3"]
    assert isinstance(bucket, S3Bucket)
    assert (bucket.access_key_id, bucket.secret_access_key_env) == ("AKID", "S")


def s3_table(*lines: str) -> str:
    return MINIMAL + "[buckets.team-data]\n" + "".join(line + "\n" for line in lines)


ENDPOINT = 'endpoint_url = "http://127.0.0.1:9000"'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (s3_table('region = "us-east-1"'), "buckets.team-data.endpoint_url: required"),
        (s3_table("endpoint_url = 9000"), "buckets.team-data.endpoint_url: 9000 is not a string"),
        (
            s3_table('endpoint_url = "127.0.0.1:9000"'),
            "buckets.team-data.endpoint_url: '127.0.0.1:9000' is not an http:// or https:// URL",
        ),
        (
            s3_table('endpoint_url = "ftp://host"'),
            "buckets.team-data.endpoint_url: 'ftp://host' is not an http:// or https:// URL",
        ),
        (
            s3_table('endpoint_url = "http://key:secret@host:9000"'),
            "buckets.team-data.endpoint_url: credentials go in access_key_id_env",
        ),
        (
            s3_table('endpoint_url = "http://host:9000/?x=1"'),
            "buckets.team-data.endpoint_url: 'http://host:9000/?x=1' has a query or fragment",
        ),
        (
            s3_table('endpoint_url = "http://host:99999"'),
            "buckets.team-data.endpoint_url: 'http://host:99999' has an invalid port",
        ),
        (
            s3_table(ENDPOINT, 'region = "US East"'),
            "buckets.team-data.region: 'US East' is not a valid region (such as us-east-1)",
        ),
        (
            s3_table(ENDPOINT, 'bucket = "Remote_Name"'),
            "buckets.team-data.bucket: 'Remote_Name' is not a valid",
        ),
        (s3_table(ENDPOINT, 'acess_key_id = "x"'), "buckets.team-data.acess_key_id: unknown key (expected"),
        (
            s3_table(
                ENDPOINT, 'access_key_id = "AKID"', 'access_key_id_env = "KEY"', 'secret_access_key = "s"'
            ),
            "buckets.team-data.access_key_id: give access_key_id or access_key_id_env, not both",
        ),
        (
            s3_table(ENDPOINT, 'access_key_id_env = "KEY"'),
            "buckets.team-data.secret_access_key_env: required with access_key_id",
        ),
        (
            s3_table(ENDPOINT, 'secret_access_key = "s"'),
            "buckets.team-data.access_key_id_env: required with secret_access_key",
        ),
        (
            s3_table(ENDPOINT, 'access_key_id_env = "MY-KEY"', 'secret_access_key_env = "S"'),
            "buckets.team-data.access_key_id_env: 'MY-KEY' is not an environment variable name",
        ),
        (
            s3_table(ENDPOINT, 'access_key_id = ""', 'secret_access_key = "s"'),
            "buckets.team-data.access_key_id: is empty",
        ),
        (
            s3_table(ENDPOINT, "secret_access_key_env = 1", 'access_key_id = "AKID"'),
            "buckets.team-data.secret_access_key_env: 1 is not a string",
        ),
        (MINIMAL + "[buckets]\nteam-data = 3\n", "buckets.team-data: 3 is not a directory or a table"),
        (MINIMAL + "[buckets.Team]\nendpoint_url = 'http://h'\n", "buckets.Team: not a valid bucket name"),
    ],
)
def test_s3_bucket_refusals_name_the_key(text: str, message: str) -> None:
    assert refused(text).startswith(message)


def test_a_bucket_names_the_accounts_that_own_it_in_either_form() -> None:
    fleet = parse_fleet(
        MINIMAL
        + '[buckets]\n"vision-data" = { path = "/srv/vision", accounts = ["vision", "123456789012"] }\n'
        + '"shared" = { path = "/srv/shared" }\n'
        + "[buckets.team-data]\nendpoint_url = 'http://h:9000'\naccounts = ['team-a']\n"
    )
    assert fleet.buckets["vision-data"] == DirectoryBucket("/srv/vision", ("vision", "123456789012"))
    assert fleet.buckets["shared"] == DirectoryBucket("/srv/shared")  # the administrators'
    team = fleet.buckets["team-data"]
    assert isinstance(team, S3Bucket) and team.accounts == ("team-a",)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('{ path = "/d", accounts = [] }', "buckets.b-1.accounts: is empty; leave it out"),
        ('{ path = "/d", accounts = ["*"] }', "buckets.b-1.accounts[0]: '*' cannot own a bucket"),
        ('{ path = "/d", accounts = ["Team A"] }', "buckets.b-1.accounts[0]: 'Team A' is not an account"),
        ('{ path = "/d", accounts = [7] }', "buckets.b-1.accounts[0]: 7 is not an account"),
        ('{ path = "/d", accounts = ["a", "a"] }', "buckets.b-1.accounts[1]: 'a' is listed twice"),
        ('{ path = "/d", accounts = "a" }', "buckets.b-1.accounts: 'a' is not a list"),
        ('{ path = "" }', "buckets.b-1.path: is empty"),
        ('{ path = "/d", owner = "a" }', "buckets.b-1.owner: unknown key (expected one of: path, accounts)"),
        (
            '{ path = "/d", endpoint_url = "http://h" }',
            "buckets.b-1: give path (a directory) or endpoint_url",
        ),
    ],
)
def test_bucket_owners_are_refused_naming_the_key(entry: str, message: str) -> None:
    assert refused(MINIMAL + f'[buckets]\n"b-1" = {entry}\n').startswith(message)


def test_images_name_their_interpreter_exactly_or_by_the_longest_prefix() -> None:
    from hyperplan.core.fleet_file import parse_fleet

    base = (
        'region = "us-west-2"\n[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\nsubnets = []\n'
        '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\ncount = 1\n'
        'price_per_instance_hour = "1"\n'
    )
    fleet = parse_fleet(
        base + '[images]\n"reg/train:*" = "/opt/py/bin/python"\n"reg/train:gpu-*" = "/opt/gpu/bin/python"\n'
        '"reg/exact:1" = "/usr/bin/python3"\n'
    )
    assert fleet.interpreter_for("reg/train:1.0") == "/opt/py/bin/python"
    assert fleet.interpreter_for("reg/train:gpu-2") == "/opt/gpu/bin/python"
    assert fleet.interpreter_for("reg/exact:1") == "/usr/bin/python3"
    assert fleet.interpreter_for("reg/exact:2") is None
    assert fleet.interpreter_for(None) is None
    import pytest

    from hyperplan.errors import ValidationError

    with pytest.raises(ValidationError, match="absolute path"):
        parse_fleet(base + '[images]\n"reg/x" = "python3"\n')


def test_webhooks_reach_public_addresses_only_unless_the_fleet_allows_networks() -> None:
    import ipaddress

    from hyperplan.core.fleet_file import parse_fleet

    assert parse_fleet(MINIMAL).webhooks.refusal(ipaddress.ip_address("127.0.0.1")) is not None
    fleet = parse_fleet(MINIMAL + '[webhooks]\nallowed_networks = ["127.0.0.0/8", "::1", "10.20.0.0/16"]\n')
    for allowed in ("127.0.0.1", "::1", "::ffff:127.0.0.2", "10.20.9.9"):
        assert fleet.webhooks.refusal(ipaddress.ip_address(allowed)) is None, allowed
    for refused_address in ("169.254.169.254", "10.21.0.1", "0.0.0.0", "fe80::1"):
        assert fleet.webhooks.refusal(ipaddress.ip_address(refused_address)) is not None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('allowed_networks = "127.0.0.0/8"', "webhooks.allowed_networks: '127.0.0.0/8' is not a list"),
        ('allowed_networks = ["localhost"]', "webhooks.allowed_networks[0]: 'localhost' is not a network"),
        ("allowed_networks = [8]", "webhooks.allowed_networks[0]: 8 is not a network"),
        ("allow_private = true", "webhooks.allow_private: unknown key"),
    ],
)
def test_webhook_settings_refusals_name_the_key(table: str, message: str) -> None:
    assert refused(MINIMAL + f"[webhooks]\n{table}\n").startswith(message)


def test_the_backend_table_names_the_work_directory() -> None:
    assert parse_fleet(MINIMAL).work_dir is None
    assert parse_fleet(MINIMAL + '[backend]\nwork_dir = "/srv/hp-work"\n').work_dir == "/srv/hp-work"
    for bad, why in (
        ('"work"', "not an absolute directory path"),
        ("3", "is not an absolute directory path"),
    ):
        with pytest.raises(ValidationError, match=f"backend.work_dir: .*{why}"):
            parse_fleet(MINIMAL + f"[backend]\nwork_dir = {bad}\n")
    with pytest.raises(ValidationError, match="backend"):
        parse_fleet(MINIMAL + '[backend]\nroot = "/x"\n')
