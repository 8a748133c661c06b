"""The seed walkthroughs with the aws CLI (tests/server/test_jobs.py, tests/server/test_clusters.py), their
bodies unchanged, with runtime podman: the training job runs examples/train_checkpointed.py in an image
of the session's registry that has numpy, its script brought in by a channel of its own as a user would;
the HyperPod cluster's nodes are containers of the fleet's node image, made and removed as the plan's
segments come and go. What the process-mode tests read from the host's tree is asserted here as a user
sees it: S3, the logs, DescribeTrainingJob, and `clusters exec` in a node."""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, contained_server, podman, push_image
from tests.harness import Server
from tests.server.test_clusters import buy_split_plan, put_lifecycle_script, seed_hyperpod_walkthrough
from tests.server.test_jobs import (
    JOB_PERIODS,
    SMALL_FLEET,
    TRAIN,
    _make_dataset,
    seed_training_job_walkthrough,
)

pytestmark = pytest.mark.containers

CONTAINERS = """
[instance_types."ml.p5.48xlarge"]    # this host plays a p5 and an m5: containers of 1 CPU and 1 GiB
vcpus = 1
memory_gib = 1

[instance_types."ml.m5.12xlarge"]
vcpus = 1
memory_gib = 1

[registries."{registry}"]
insecure = true

[backend]
runtime = "podman"
podman_store = "{store}"
node_image = "{node_image}"
"""


@pytest.fixture
def store(tmp_path_factory: pytest.TempPathFactory) -> PodmanStore:
    """The server's Podman store (contained_server prepares it, and removes it)."""
    return PodmanStore(tmp_path_factory.mktemp("walkthrough-store"))


@pytest.fixture
def small(built: Built, store: PodmanStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The small fleet of the process-mode walkthroughs, its work in containers, its nodes of the Python
    image; the short grace and sync periods of tests/server/test_jobs.py."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    extra = CONTAINERS.format(registry=built.registry, store=store.root, node_image=built.python)
    with contained_server(store, SMALL_FLEET.read_text() + extra) as server:
        yield server


# -- the training job ---------------------------------------------------------------------------------

# numpy as pip would put it into an image: this interpreter's wheel, with the libraries auditwheel keeps
# beside it (numpy.libs: OpenBLAS, gfortran), built for this CPython, which must be the image's (Debian
# bookworm's 3.11). A layer of its own on the Python image costs seconds; `image-dev build --packages
# python3-numpy` would be another mmdebstrap build (about half a minute on this machine) in a part whose
# budget is 6 minutes.
IMAGE_PYTHON = (3, 11)
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"  # the image's Python looks there first


@pytest.fixture(scope="module")
def numpy_image(built: Built, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Python image with numpy, pushed to the session's registry."""
    assert sys.version_info[:2] == IMAGE_PYTHON, "this interpreter's numpy would not load in the image"
    context = tmp_path_factory.mktemp("numpy-context")
    _copy_wheel("numpy", context / "packages")
    (context / "Containerfile").write_text(f"FROM {built.python}\nCOPY packages {SITE_PACKAGES}\n")
    return push_image(built, context, "numpy:1", tmp_path_factory)


def _copy_wheel(name: str, into: Path) -> None:
    """Package ``name`` of this interpreter, and its auditwheel libraries, into ``into`` (no tests)."""
    package = Path(importlib.import_module(name).__file__ or "").parent
    skipped = shutil.ignore_patterns("__pycache__", "tests")
    shutil.copytree(package, into / name, ignore=skipped)
    libraries = package.with_name(f"{name}.libs")
    if libraries.is_dir():
        shutil.copytree(libraries, into / libraries.name)


def test_the_training_job_walkthrough_runs_in_containers(small: Server, numpy_image: str) -> None:
    _make_dataset(small)
    code = small.data_dir / "s3" / "bucket" / "code"
    code.mkdir(parents=True)
    shutil.copyfile(TRAIN, code / "train.py")
    channel = {
        "ChannelName": "code",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/code"}},
    }
    job = seed_training_job_walkthrough(
        small, numpy_image, ["python3", "/opt/ml/input/data/code/train.py"], channels=(channel,)
    )
    # What the process-mode test reads from the host's tree, as DescribeTrainingJob and the API say it.
    assert job["HyperParameters"] == {"lr": "0.2", "seed": "3"}
    assert job["AlgorithmSpecification"]["TrainingImage"] == numpy_image
    view = small.native().get("/api/v1/training-jobs/job-name")
    assert view["ResolvedImage"] == numpy_image and view["ImageDigest"].startswith("sha256:"), view
    messages = [t.get("StatusMessage", "") for t in job["SecondaryStatusTransitions"]]
    assert any(view["ImageDigest"] in message for message in messages), messages  # pulled, then run


# -- the HyperPod cluster -----------------------------------------------------------------------------


def test_the_hyperpod_walkthrough_runs_in_containers(
    small: Server, store: PodmanStore, tmp_path: Path
) -> None:
    put_lifecycle_script(small)
    seed_hyperpod_walkthrough(small, *buy_split_plan(small), tmp_path)
    # The controller, on demand, outlives the plan's segments: its OnCreate ran in its container, as root
    # there and a subordinate id here.
    nodes = small.sagemaker().list_cluster_nodes(ClusterName="ml-cluster")["ClusterNodeSummaries"]
    (controller,) = [n for n in nodes if n["InstanceGroupName"] == "controller-machine"]
    at = f"/api/v1/clusters/ml-cluster/nodes/{controller['InstanceId']}/exec"

    def run(*command: str) -> str:
        answer = small.native().post(at, {"Command": list(command)})
        assert answer["ExitCode"] == 0, answer
        return str(answer["Stdout"])

    # exec starts in the node's home (root's); OnCreate ran where the lifecycle scripts were copied.
    assert run("cat", "lifecycle/created.txt").startswith("created on ")
    assert run("id", "-u").strip() == "0"
    inside, outside, _count = run("cat", "/proc/self/uid_map").split()
    assert inside == "0" and int(outside) >= 2**20  # root there is nobody here
    # Each node a pod of its own: the workers' went with them at the end of the plan; the controller's stays.
    pods = podman(store, "pod", "ps", "--format", "{{.Name}}").stdout.split()
    assert len(pods) == 1 and pods[0].endswith(controller["InstanceId"]), pods
