"""The SageMaker Python SDK's walkthrough (tests/server/test_sdk.py, the shortest form), unchanged, with
runtime podman: the job runs in the registry's Python image, its script-mode launcher with the image's
python3, held through its first segment, interrupted at the reclaim (SIGTERM in its container), resumed
from its checkpoint in the next segment, and its model in hyperplan's S3."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, contained_server
from tests.harness import Server
from tests.server.test_sdk import SMALL_FLEET
from tests.server.test_sdk import (
    test_the_sdk_with_its_defaults_against_one_endpoint as sdk_walkthrough,  # not collected here
)

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(find_spec("sagemaker") is None, reason="the SageMaker Python SDK is not installed"),
]

CONTAINERS = """
[instance_types."ml.p5.48xlarge"]    # this host plays a p5: a container of 1 CPU and 1 GiB
vcpus = 1
memory_gib = 1

[image_map]
"763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:*" = "{python}"

[registries."{registry}"]
insecure = true

[backend]
runtime = "podman"
podman_store = "{store}"
"""


@pytest.fixture
def one_endpoint(
    built: Built, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    for name, value in {
        "HYPERPLAN_JOB_RECLAIM_GRACE": "5",
        "HYPERPLAN_JOB_STOP_GRACE": "5",
        "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3",
    }.items():
        monkeypatch.setenv(name, value)
    store = PodmanStore(tmp_path_factory.mktemp("sdk-store"))
    extra = CONTAINERS.format(python=built.python, registry=built.registry, store=store.root)
    with contained_server(store, SMALL_FLEET.read_text() + extra) as server:
        yield server


def test_the_sdk_walkthrough_runs_in_containers(one_endpoint: Server, tmp_path: Path) -> None:
    sdk_walkthrough(one_endpoint, tmp_path)
    view = one_endpoint.native().get("/api/v1/training-jobs/sdk-job")
    assert view["ResolvedImage"].endswith("/hyperplan/python:3") and view["ImageDigest"].startswith("sha256:")
