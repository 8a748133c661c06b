"""The fleet file's ``[instance_types]``: each pool's type sized from AWS's published figures, the fleet
file's own over them, and every bad value refused with the key that holds it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import botocore.session
import pytest

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.instance_types import AWS_INSTANCE_TYPES, InstanceType
from hyperplan.errors import ValidationError
from tests.core.support import fleet as hand_built_fleet

BENCH_FLEET = Path(__file__).parents[2] / "bench" / "fleet.toml"

ZONE = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
"""


def pools(*types: str) -> str:
    return "".join(
        f'[[pools]]\ninstance_type = "{name}"\nzone = "us-west-2a"\ncount = 4\n'
        'price_per_instance_hour = "9"\n'
        for name in types
    )


P5_AND_M5 = ZONE + pools("ml.p5.48xlarge", "ml.m5.12xlarge")


def sized(table: str, text: str = P5_AND_M5) -> str:
    return text + table


def refused(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(text)
    return caught.value.message


def demo_text() -> str:
    return resources.files("hyperplan.fleet").joinpath("demo.toml").read_text()


# -- the defaults -----------------------------------------------------------------------------------


def test_a_pool_of_a_known_type_takes_aws_figures() -> None:
    fleet = parse_fleet(P5_AND_M5)
    assert fleet.instance_type("ml.p5.48xlarge") == InstanceType(
        "ml.p5.48xlarge", 192, 2048, 8, "NVIDIA H100"
    )
    assert fleet.instance_type("ml.m5.12xlarge") == InstanceType("ml.m5.12xlarge", 48, 192, 0, None)
    assert set(fleet.instance_types) == {"ml.p5.48xlarge", "ml.m5.12xlarge"}


@pytest.mark.parametrize("text", [demo_text(), BENCH_FLEET.read_text()], ids=["demo fleet", "bench fleet"])
def test_every_pool_of_the_demo_and_bench_fleets_is_sized_from_aws_figures(text: str) -> None:
    fleet = parse_fleet(text)
    for pool in fleet.pools:
        assert fleet.instance_type(pool.instance_type) == AWS_INSTANCE_TYPES[pool.instance_type]


def test_the_demo_fleets_accelerated_and_cpu_types() -> None:
    demo = parse_fleet(demo_text())
    assert demo.instance_type("ml.trn2.48xlarge") == InstanceType(
        "ml.trn2.48xlarge", 192, 2048, 16, "AWS Trainium2"
    )
    assert demo.instance_type("ml.p4d.24xlarge") == InstanceType(
        "ml.p4d.24xlarge", 96, 1152, 8, "NVIDIA A100"
    )
    assert demo.instance_type("ml.t3.xlarge") == InstanceType("ml.t3.xlarge", 4, 16, 0, None)


def test_the_catalogue_names_only_types_sagemaker_accepts_and_sizes_them_consistently() -> None:
    """botocore's SageMaker model lists the types training jobs and HyperPod clusters accept: a name
    spelt wrong here would never match a pool."""
    shapes = botocore.session.get_session().get_service_model("sagemaker").shape_for
    accepted = {*shapes("TrainingInstanceType").enum, *shapes("ClusterInstanceType").enum}
    assert set(AWS_INSTANCE_TYPES) <= accepted
    for name, size in AWS_INSTANCE_TYPES.items():
        assert size.name == name
        assert size.vcpus >= 2 and size.memory_gib >= 4
        assert (size.accelerators == 0) == (size.accelerator_kind is None)


def test_a_hand_built_fleet_falls_back_to_aws_figures_and_knows_no_others() -> None:
    fleet = hand_built_fleet()
    assert fleet.instance_type("ml.p5.48xlarge") == AWS_INSTANCE_TYPES["ml.p5.48xlarge"]
    with pytest.raises(KeyError, match=r"ml\.x9\.huge"):
        fleet.instance_type("ml.x9.huge")


# -- overrides and new types ------------------------------------------------------------------------


def test_a_partial_override_keeps_the_other_published_figures() -> None:
    fleet = parse_fleet(sized('[instance_types."ml.p5.48xlarge"]\nmemory_gib = 1900\n'))
    assert fleet.instance_type("ml.p5.48xlarge") == InstanceType(
        "ml.p5.48xlarge", 192, 1900, 8, "NVIDIA H100"
    )
    assert fleet.instance_type("ml.m5.12xlarge") == AWS_INSTANCE_TYPES["ml.m5.12xlarge"]


def test_an_override_of_the_accelerators_keeps_their_kind_unless_it_takes_them_all_away() -> None:
    fewer = parse_fleet(sized('[instance_types."ml.p5.48xlarge"]\naccelerators = 4\n'))
    assert fewer.instance_type("ml.p5.48xlarge") == InstanceType(
        "ml.p5.48xlarge", 192, 2048, 4, "NVIDIA H100"
    )
    none = parse_fleet(sized('[instance_types."ml.p5.48xlarge"]\naccelerators = 0\n'))
    assert none.instance_type("ml.p5.48xlarge") == InstanceType("ml.p5.48xlarge", 192, 2048, 0, None)
    renamed = parse_fleet(sized('[instance_types."ml.p5.48xlarge"]\naccelerator_kind = "NVIDIA H100 80GB"\n'))
    assert renamed.instance_type("ml.p5.48xlarge").accelerator_kind == "NVIDIA H100 80GB"


def test_a_type_without_published_figures_is_sized_by_its_table() -> None:
    g6 = '[instance_types."ml.g6.12xlarge"]\nvcpus = 48\nmemory_gib = 192\naccelerators = 4\n'
    fleet = parse_fleet(sized(g6 + 'accelerator_kind = "NVIDIA L4"\n', ZONE + pools("ml.g6.12xlarge")))
    assert fleet.instance_type("ml.g6.12xlarge") == InstanceType("ml.g6.12xlarge", 48, 192, 4, "NVIDIA L4")
    cpu = '[instance_types."ml.r7i.large"]\nvcpus = 2\nmemory_gib = 16\n'
    fleet = parse_fleet(sized(cpu, ZONE + pools("ml.r7i.large")))
    assert fleet.instance_type("ml.r7i.large") == InstanceType("ml.r7i.large", 2, 16, 0, None)


def test_a_type_sized_but_not_pooled_is_kept() -> None:
    fleet = parse_fleet(sized('[instance_types."ml.r7i.large"]\nvcpus = 2\nmemory_gib = 16\n'))
    assert fleet.instance_type("ml.r7i.large") == InstanceType("ml.r7i.large", 2, 16, 0, None)


def test_the_demo_fleets_commented_example_is_honoured_once_uncommented() -> None:
    """The demo documents the table with a commented example: taken out of its comments, it must read."""
    lines = demo_text().splitlines()
    start = lines.index('# [instance_types."ml.p5.48xlarge"]')
    example = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        example.append(line.removeprefix("#").removeprefix(" "))
    text = demo_text() + "\n".join(example) + "\n"
    fleet = parse_fleet(text.replace('instance_type = "ml.t3.xlarge"', 'instance_type = "ml.g6.12xlarge"'))
    assert fleet.instance_type("ml.p5.48xlarge") == InstanceType(
        "ml.p5.48xlarge", 192, 1900, 8, "NVIDIA H100"
    )
    assert fleet.instance_type("ml.g6.12xlarge") == InstanceType("ml.g6.12xlarge", 48, 192, 4, "NVIDIA L4")


# -- refusals ---------------------------------------------------------------------------------------


def test_a_pool_of_a_type_nobody_sized_names_the_type_and_the_table_to_add() -> None:
    message = refused(ZONE + pools("ml.p5.48xlarge", "ml.g6.12xlarge"))
    assert message.startswith("pools[1].instance_type: ml.g6.12xlarge has no published figures")
    assert '[instance_types."ml.g6.12xlarge"] with vcpus, memory_gib' in message


P5 = '[instance_types."ml.p5.48xlarge"]\n'
G6 = '[instance_types."ml.g6.12xlarge"]\n'
G6_POOL = ZONE + pools("ml.g6.12xlarge")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (sized(P5 + "vcpus = 0\n"), 'instance_types."ml.p5.48xlarge".vcpus: 0 is less than 1'),
        (sized(P5 + "vcpus = -8\n"), 'instance_types."ml.p5.48xlarge".vcpus: -8 is less than 1'),
        (
            sized(P5 + 'vcpus = "192"\n'),
            "instance_types.\"ml.p5.48xlarge\".vcpus: '192' is not a whole number",
        ),
        (sized(P5 + "vcpus = true\n"), 'instance_types."ml.p5.48xlarge".vcpus: True is not a whole number'),
        (sized(P5 + "memory_gib = 0\n"), 'instance_types."ml.p5.48xlarge".memory_gib: 0 is less than 1'),
        (
            sized(P5 + "memory_gib = 1900.5\n"),
            'instance_types."ml.p5.48xlarge".memory_gib: 1900.5 is not a whole number',
        ),
        (
            sized(P5 + "accelerators = -1\n"),
            'instance_types."ml.p5.48xlarge".accelerators: -1 is less than 0',
        ),
        (
            sized(P5 + 'accelerators = 0\naccelerator_kind = "NVIDIA H100"\n'),
            "instance_types.\"ml.p5.48xlarge\".accelerator_kind: 'NVIDIA H100' given, but ml.p5.48xlarge "
            "has no accelerators",
        ),
        (
            sized(P5 + 'accelerator_kind = " "\n'),
            'instance_types."ml.p5.48xlarge".accelerator_kind: is empty',
        ),
        (
            sized(P5 + "accelerator_kind = 8\n"),
            'instance_types."ml.p5.48xlarge".accelerator_kind: 8 is not a string',
        ),
        (
            sized(P5 + "gpus = 8\n"),
            'instance_types."ml.p5.48xlarge".gpus: unknown key (expected one of: vcpus',
        ),
        (
            sized(G6 + "memory_gib = 192\n", G6_POOL),
            'instance_types."ml.g6.12xlarge".vcpus: required: ml.g6.12xlarge has no published figures',
        ),
        (
            sized(G6 + "vcpus = 48\n", G6_POOL),
            'instance_types."ml.g6.12xlarge".memory_gib: required: ml.g6.12xlarge has no published figures',
        ),
        (
            sized(G6 + "vcpus = 48\nmemory_gib = 192\naccelerators = 4\n", G6_POOL),
            'instance_types."ml.g6.12xlarge".accelerator_kind: required: ml.g6.12xlarge has 4 accelerators',
        ),
        (
            sized('[instance_types."p5.48xlarge"]\nvcpus = 2\n'),
            "instance_types.\"p5.48xlarge\": 'p5.48xlarge' is not an instance type such as ml.p5.48xlarge",
        ),
        (
            sized('[instance_types]\n"ml.p5.48xlarge" = 192\n'),
            'instance_types."ml.p5.48xlarge": 192 is not a table of vcpus, memory_gib',
        ),
        ("instance_types = 3\n" + P5_AND_M5, "instance_types: 3 is not a table"),
    ],
)
def test_refusals_name_the_key(text: str, message: str) -> None:
    assert refused(text).startswith(message)
