"""Image references and the image map: the grammar a TrainingImage must follow, what each map entry
resolves it to, and the fleet file's [image_map] and [registries] tables (core/image_refs.py)."""

from __future__ import annotations

from importlib import resources

import pytest

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.image_refs import (
    ImageReference,
    build_image_map,
    check_training_image,
    parse_image,
    parse_registry_host,
)
from hyperplan.errors import ValidationError

ECR = "763104351884.dkr.ecr.us-west-2.amazonaws.com"
PYTORCH = f"{ECR}/pytorch-training:2.3.0-gpu-py311"
SHA256 = "sha256:" + "0123456789abcdef" * 4

FLEET = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
[[pools]]
instance_type = "ml.m5.12xlarge"
zone = "us-west-2a"
count = 4
reservable = 0
price_per_instance_hour = "2.765"
"""


def refusal(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_image(text)
    return caught.value.message


def fleet_refusal(tables: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_fleet(FLEET + tables)
    return caught.value.message


def resolved(entries: dict[str, object], uri: str) -> str:
    return str(build_image_map(entries).resolve(uri).reference)


# -- the grammar --------------------------------------------------------------------------------------


def test_an_ecr_uri_is_a_registry_a_repository_and_a_tag() -> None:
    assert parse_image(PYTORCH) == ImageReference(ECR, "pytorch-training", "2.3.0-gpu-py311")
    assert str(parse_image(PYTORCH)) == PYTORCH
    assert parse_image(PYTORCH).registry_host == ECR


def test_a_first_component_without_a_dot_or_a_port_is_a_path_pulled_from_docker_hub() -> None:
    local = parse_image("local/python:3")
    assert (local.registry, local.path, local.tag) == (None, "local/python", "3")
    assert local.registry_host == "docker.io"
    assert parse_image("ubuntu").tag is None
    assert parse_image("localhost/team/img:1").registry == "localhost"
    assert parse_image("127.0.0.1:5000/hyperplan/python:3").registry == "127.0.0.1:5000"
    assert parse_image("[::1]:5000/hyperplan/python").registry == "[::1]:5000"
    # A capital letter makes the first component a host (Docker's rule), whose case does not count.
    assert parse_image("Registry.Example.com/team/img:1").registry_host == "registry.example.com"


def test_digests_alone_or_after_a_tag() -> None:
    pinned = parse_image(f"{ECR}/pytorch-training@{SHA256}")
    assert (pinned.tag, pinned.digest) == (None, SHA256)
    both = parse_image(f"127.0.0.1:5000/hyperplan/python:3@{SHA256}")
    assert (both.registry, both.tag, both.digest) == ("127.0.0.1:5000", "3", SHA256)
    assert str(both) == f"127.0.0.1:5000/hyperplan/python:3@{SHA256}"
    assert parse_image("img@sha512:" + "ab" * 64).digest == "sha512:" + "ab" * 64
    assert parse_image("img@blake3:" + "ab" * 16).digest  # an algorithm the spec does not register


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "it is empty"),
        ("local/python: 3", "space or a control character"),
        ("Local/Python:3", "'Python' must be lower-case"),
        ("team/Img:1", "'Img' must be lower-case"),
        ("team//img", "empty component"),
        ("team/img/", "empty component"),
        ("team/-img", "'-img' must be lower-case letters and digits, joined by"),
        ("team/img:", "the tag '' must be 1-128"),
        ("team/img:-1", "the tag '-1' must be 1-128"),
        ("team/img:" + "t" * 129, "must be 1-128"),
        ("team/img@sha256:abc", "the digest 'sha256:abc' must be ALGORITHM:HEX"),
        ("team/img@sha256:" + "A" * 64, "a sha256 digest is 64 lower-case hex digits"),
        ("team/img@sha256:" + "a" * 63 + "0a", "a sha256 digest is 64 lower-case hex digits"),
        ("team/img@" + SHA256 + "@" + SHA256, "must be ALGORITHM:HEX"),
        ("reg_istry.example.com/img", "the registry 'reg_istry.example.com' must be a host name"),
        ("-registry.example.com/img", "the registry '-registry.example.com' must be a host name"),
        ("127.0.0.1:0/img", "port 0; a port is 1-65535"),
        ("127.0.0.1:65536/img", "port 65536"),
        ("registry.example.com/" + "a" * 240, "its name (registry and repository) is 261 characters"),
        ("@" + SHA256, "it names no repository"),
    ],
)
def test_a_malformed_reference_is_refused_saying_what_is_wrong(text: str, complaint: str) -> None:
    message = refusal(text)
    assert "is not an image reference" in message and complaint in message, message


def test_a_training_image_is_within_botocores_bound_of_255_characters() -> None:
    longest = "a" * 250 + ":tag"  # 254 characters: a name of 250, which the grammar takes
    assert check_training_image(longest).tag == "tag"
    with pytest.raises(ValidationError, match="is 256 characters long; at most 255"):
        check_training_image("a" * 252 + ":tag")


def test_a_registry_is_a_host_and_an_optional_port() -> None:
    assert parse_registry_host("Registry.Example.com:5000") == "registry.example.com:5000"
    assert parse_registry_host("[::1]:5000") == "[::1]:5000"
    for bad in ("", "a b", "registry.example.com/team", "host:port", "127.0.0.1:70000", "http://host"):
        with pytest.raises(ValidationError, match="is not a registry"):
            parse_registry_host(bad)


# -- the image map ------------------------------------------------------------------------------------


def test_an_exact_entry_maps_that_uri_only() -> None:
    entries = {"local/python:3": "127.0.0.1:5000/hyperplan/python:3"}
    assert resolved(entries, "local/python:3") == "127.0.0.1:5000/hyperplan/python:3"
    assert resolved(entries, "local/python:3.11") == "local/python:3.11"  # not a prefix


def test_a_prefix_entry_appends_the_rest_of_the_uri() -> None:
    entries = {f"{ECR}/pytorch-training:*": "registry.example.com/mirror/pytorch-training:*"}
    assert resolved(entries, PYTORCH) == "registry.example.com/mirror/pytorch-training:2.3.0-gpu-py311"
    assert resolved({f"{ECR}/*": "registry.example.com/ecr/*"}, PYTORCH) == (
        "registry.example.com/ecr/pytorch-training:2.3.0-gpu-py311"
    )


def test_a_prefix_entry_with_a_plain_target_maps_every_match_to_that_one_reference() -> None:
    entries = {f"{ECR}/pytorch-training:*": "127.0.0.1:5000/hyperplan/sagemaker-python:3"}
    for tag in ("2.3.0-gpu-py311", "1.13-cpu-py39", "latest"):
        uri = f"{ECR}/pytorch-training:{tag}"
        assert resolved(entries, uri) == "127.0.0.1:5000/hyperplan/sagemaker-python:3"
    # The ':' keeps a neighbouring repository out.
    assert resolved(entries, f"{ECR}/pytorch-training-neuronx:2.1") == f"{ECR}/pytorch-training-neuronx:2.1"


def test_the_longest_prefix_wins_and_an_exact_entry_beats_every_prefix() -> None:
    entries = {
        f"{ECR}/*": "registry.example.com/ecr/*",
        f"{ECR}/pytorch-training:*": "registry.example.com/torch:*",
        f"{ECR}/pytorch-training:2.3.*": "registry.example.com/torch23:*",
        PYTORCH: "registry.example.com/pinned@" + SHA256,
    }
    mapping = build_image_map(entries)
    assert str(mapping.resolve(PYTORCH).reference) == "registry.example.com/pinned@" + SHA256
    assert mapping.resolve(PYTORCH).entry == PYTORCH
    found = mapping.resolve(f"{ECR}/pytorch-training:2.3.1-gpu-py311")
    assert (str(found.reference), found.entry) == (
        "registry.example.com/torch23:1-gpu-py311",
        f"{ECR}/pytorch-training:2.3.*",
    )
    assert str(mapping.resolve(f"{ECR}/pytorch-training:1.13").reference) == "registry.example.com/torch:1.13"
    assert str(mapping.resolve(f"{ECR}/tensorflow-training:2.16").reference) == (
        "registry.example.com/ecr/tensorflow-training:2.16"
    )


def test_an_unmapped_uri_resolves_to_itself() -> None:
    mapping = build_image_map({"local/python:3": "127.0.0.1:5000/hyperplan/python:3"})
    for uri in (PYTORCH, "ubuntu:22.04", f"img@{SHA256}"):
        found = mapping.resolve(uri)
        assert (str(found.reference), found.entry) == (uri, None)
    assert str(build_image_map({}).resolve("local/python:3").reference) == "local/python:3"


def test_a_malformed_uri_is_refused_before_any_entry_is_tried() -> None:
    mapping = build_image_map({"Local*": "127.0.0.1:5000/x:*"})
    with pytest.raises(ValidationError, match="'Python' must be lower-case"):
        mapping.resolve("Local/Python:3")


def test_a_prefix_target_that_makes_no_reference_is_refused_naming_the_entry() -> None:
    mapping = build_image_map({"team/*": "127.0.0.1:5000/mirror:*"})  # the rest lands in the tag
    with pytest.raises(ValidationError) as caught:
        mapping.resolve("team/img:1")
    message = caught.value.message
    assert (
        "the fleet's image_map entry 'team/*' maps 'team/img:1' to '127.0.0.1:5000/mirror:img:1'" in message
    )
    assert "the repository path component 'mirror:img' must be lower-case letters" in message


@pytest.mark.parametrize(
    ("entries", "complaint"),
    [
        ({"local/Python:3": "x:1"}, "'local/Python:3' is not an image reference"),
        ({"local/python:3": "Bad/Ref"}, "'Ref' must be lower-case"),
        ({"local/python:3": "x:*"}, "only a prefix entry (\"PREFIX*\") may end its target in '*'"),
        ({"local/python:3": 3}, "3 is not a string"),
        ({"*": "x:1"}, "a prefix entry's key is empty"),
        ({"a*b*": "x:1"}, "a '*' may only end a key or a target"),
        ({"a*b": "x:1"}, "a '*' may only end a key (a prefix entry)"),
        ({"team /*": "x:1"}, "holds characters no image reference has"),
        ({"team/*": "*"}, "a target prefix is empty"),
        ({"team/*": ["x"]}, "is not a string"),
        ({"team/*": "Bad/Ref"}, "'Ref' must be lower-case"),
    ],
)
def test_a_bad_entry_is_refused_naming_its_key(entries: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build_image_map(entries)
    key = next(iter(entries))
    assert caught.value.message.startswith(f'image_map."{key}": '), caught.value.message
    assert complaint in caught.value.message, caught.value.message


# -- the fleet file -----------------------------------------------------------------------------------


def test_the_fleet_file_maps_images_and_names_its_insecure_registries() -> None:
    fleet = parse_fleet(
        FLEET
        + '[image_map]\n"local/python:3" = "127.0.0.1:5000/hyperplan/python:3"\n'
        + f'"{ECR}/pytorch-training:*" = "registry.example.com/mirror/pytorch-training:*"\n'
        + '[registries."127.0.0.1:5000"]\ninsecure = true\n'
        + '[registries."Registry.Example.com"]\n'
    )
    assert str(fleet.resolve_image("local/python:3").reference) == "127.0.0.1:5000/hyperplan/python:3"
    assert str(fleet.resolve_image(PYTORCH).reference) == (
        "registry.example.com/mirror/pytorch-training:2.3.0-gpu-py311"
    )
    assert str(fleet.resolve_image("ubuntu:22.04").reference) == "ubuntu:22.04"
    sources = fleet.image_sources
    assert sorted(sources.registries) == ["127.0.0.1:5000", "registry.example.com"]
    assert sources.insecure("127.0.0.1:5000") and not sources.insecure("registry.example.com")
    assert not sources.insecure("elsewhere.example.com:443")  # unlisted: HTTPS
    assert not parse_fleet(FLEET).image_sources.registries  # both tables are optional


@pytest.mark.parametrize(
    ("tables", "complaint"),
    [
        ('[image_map]\n"local/python:3" = "Bad/Ref"\n', 'image_map."local/python:3": '),
        (
            '[registries."bad host"]\ninsecure = true\n',
            "registries.\"bad host\": 'bad host' is not a registry",
        ),
        (
            '[registries."127.0.0.1:5000"]\ninsecure = "yes"\n',
            "registries.\"127.0.0.1:5000\".insecure: 'yes'",
        ),
        ('[registries."127.0.0.1:5000"]\nsecure = true\n', 'registries."127.0.0.1:5000".secure: unknown key'),
        ('[registries]\n"127.0.0.1:5000" = true\n', 'registries."127.0.0.1:5000": True is not a table'),
        (
            '[registries."reg.example.com"]\n[registries."REG.example.com"]\n',
            'registries."REG.example.com": the same registry as another key',
        ),
    ],
)
def test_a_bad_table_entry_is_refused_naming_its_key(tables: str, complaint: str) -> None:
    assert complaint in fleet_refusal(tables)


def test_the_demo_fleet_maps_local_python_and_the_sdks_framework_images_to_the_dev_registry() -> None:
    fleet = parse_fleet(resources.files("hyperplan.fleet").joinpath("demo.toml").read_text())
    python, sagemaker = "127.0.0.1:5000/hyperplan/python:3", "127.0.0.1:5000/hyperplan/sagemaker-python:3"
    assert str(fleet.resolve_image("local/python:3").reference) == python
    # What the SDK's image_uris.retrieve gives for the demo's region (training scope).
    for uri in (
        PYTORCH,
        f"{ECR}/pytorch-training:2.3-gpu-py311",
        f"{ECR}/tensorflow-training:2.16-gpu-py310",
        f"{ECR}/mxnet-training:1.9-gpu-py38",
        f"{ECR}/huggingface-pytorch-training:2.1.0-transformers4.36-gpu-py310-cu121-ubuntu20.04",
        f"{ECR}/pytorch-training-neuronx:2.1.2-neuronx-py310-sdk2.18.0-ubuntu20.04",
        "246618743249.dkr.ecr.us-west-2.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3",
        "246618743249.dkr.ecr.us-west-2.amazonaws.com/sagemaker-xgboost:1.7-1",
    ):
        assert str(fleet.resolve_image(uri).reference) == sagemaker, uri
    assert str(fleet.resolve_image("ubuntu:22.04").reference) == "ubuntu:22.04"
    assert fleet.image_sources.insecure("127.0.0.1:5000")
