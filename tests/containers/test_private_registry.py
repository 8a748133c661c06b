"""A registry that asks for a login, and a server that pulls from it with the credentials an administrator
set through our CLI: jobs' images and the fleet's HyperPod node image, each logged in with the sealed
credentials, and a job refused an image its registry would not give it, before any instance starts.

The registry is `registry-dev up --login` on a free port; `image-dev build --authfile` pushes the
session's Python image into it, once as a job's image and once as the node image, so that nodes pull an
image no job pulled before them. One server per module (runtime podman, as root in isolation mode users),
whose fleet names that registry plain HTTP. Each test sets or deletes the credentials it needs first.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperplan.containers.podman import PodmanStore
from hyperplan.signing import Credentials
from tests.containers.conftest import CONTAINED_FLEET, contained_server, run_wide_directory, script
from tests.harness import Server, wait_until

pytestmark = pytest.mark.containers

USERNAME = "puller"
PASSWORD = "private-pull-8c3e5a1f"
TYPE = "ml.m5.12xlarge"
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"


@dataclass(frozen=True)
class Private:
    registry: str  # 127.0.0.1:PORT, asking for USERNAME's login
    python: str  # a job's image there, and the digest image-dev pushed
    python_digest: str
    node: str  # the same image under the name only nodes pull


@pytest.fixture(scope="module")
def private(container_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    directory = tmp_path_factory.mktemp("private-registry")
    store = PodmanStore(tmp_path_factory.mktemp("private-build-store"))
    try:
        up = script(
            "registry-dev", "up", directory, "--port", "0", "--login", USERNAME, stdin=PASSWORD + "\n"
        )
        assert up.returncode == 0, up.stderr
        registry = up.stdout.strip()
        authfile = directory / "auth.json"
        login = subprocess.run(
            ["podman", "login", "--tls-verify=false", "--authfile", authfile, "--username", USERNAME,
             "--password-stdin", registry],
            input=PASSWORD, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert login.returncode == 0, login.stderr
        pushed = [
            _build(registry, name, authfile, store, tmp_path_factory) for name in ("python:3", "node:1")
        ]
        (python, digest), (node, _) = pushed
        yield Private(registry, python, digest, node)
    finally:
        store.remove()
        script("registry-dev", "down", directory)


def _build(
    registry: str, name: str, authfile: Path, store: PodmanStore, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    """`image-dev build` of the session's Python image (its root file system from the run's cache), pushed
    as ``hyperplan/NAME`` with the registry's login; the reference and digest it printed."""
    cache = run_wide_directory(tmp_path_factory) / "image-dev-cache"
    built = script(
        "image-dev", "build", registry, "--name", f"hyperplan/{name}", "--authfile", authfile,
        "--cache", cache, "--store", store.root,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    reference, digest = built.stdout.split()
    return reference, digest


@pytest.fixture(scope="module")
def server(private: Private, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = PodmanStore(tmp_path_factory.mktemp("private-server-store"))
    fleet = CONTAINED_FLEET.format(
        store=store.root, store_gb=0, registry=private.registry, node_image=private.node
    )
    with contained_server(store, fleet) as server:
        (server.data_dir / "s3" / "lifecycle" / "private").mkdir(parents=True)
        (server.data_dir / "s3" / "lifecycle" / "private" / "on_create.sh").write_text("#!/bin/sh\ntrue\n")
        server.native().post("/api/v1/buckets/lifecycle/grants", {"Account": "*", "ReadOnly": True})
        yield server


def set_credentials(server: Server, registry: str, password: str) -> None:
    """What an administrator runs: the password on standard input, never an argument."""
    server.cli(
        "registries", "set-credentials", registry, "--username", USERNAME, "--password-stdin",
        stdin=password + "\n",
    )  # fmt: skip


def _job(name: str, image: str) -> dict[str, Any]:
    program = "open('/opt/ml/model/ok.txt', 'w').write('pulled')"
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": image,
            "ContainerEntrypoint": ["python3", "-c", program],
        },
        "OutputDataConfig": {"S3OutputPath": f"s3://out-{name}/output"},
        "ResourceConfig": {"InstanceType": TYPE, "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _run(server: Server, team: Credentials, name: str, image: str) -> dict[str, Any]:
    """A job of one instance created and waited for; how it ended."""
    client = server.sagemaker(team)
    client.create_training_job(**_job(name, image))
    final = ("Completed", "Failed", "Stopped")
    job = wait_until(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in final and d,
        timeout=180,
    )
    assert job, f"{name} did not end:\n{server.log()[-3000:]}"
    return dict(job)


def test_a_job_s_image_is_refused_without_the_registry_s_login_and_pulled_with_it(
    server: Server, private: Private
) -> None:
    server.cli("registries", "delete-credentials", private.registry, check=False)  # none set yet
    team = server.new_account("private-team")
    for name, password in (("no-login", None), ("wrong-login", "not-the-password")):
        if password is not None:
            set_credentials(server, private.registry, password)
        refused = _run(server, team, name, private.python)
        reason = refused.get("FailureReason", "")
        assert refused["TrainingJobStatus"] == "Failed", refused
        assert reason.startswith(f"ClientError: the training image {private.python} cannot be used"), reason
        assert "it could not be pulled: " in reason and "unauthorized: authentication required" in reason
        assert "TrainingStartTime" not in refused and refused.get("BillableTimeInSeconds", 0) == 0

    set_credentials(server, private.registry, PASSWORD)
    assert PASSWORD not in server.cli("registries", "list").stdout
    ended = _run(server, team, "with-login", private.python)
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    model = server.data_dir / "s3" / "out-with-login" / "output" / "with-login" / "output" / "model.tar.gz"
    assert model.exists()
    view = server.native(team).get("/api/v1/training-jobs/with-login")
    assert view["ImageDigest"] == private.python_digest  # what image-dev pushed is what ran
    assert PASSWORD not in server.log()


def test_a_hyperpod_node_pulls_the_fleet_s_node_image_with_the_registry_s_login(
    server: Server, private: Private
) -> None:
    set_credentials(server, private.registry, PASSWORD)
    team = server.new_account("private-nodes")
    client = server.sagemaker(team)
    client.create_cluster(
        ClusterName="private",
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": TYPE,
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/private", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 1}}],
            }
        ],
    )

    def statuses() -> list[str]:
        nodes = client.list_cluster_nodes(ClusterName="private")["ClusterNodeSummaries"]
        return [node["InstanceStatus"]["Status"] for node in nodes]

    settled = wait_until(lambda: (now := statuses()) and "Pending" not in now and now, timeout=180)
    detail = client.list_cluster_nodes(ClusterName="private")["ClusterNodeSummaries"]
    assert settled == ["Running"], (detail, server.log()[-3000:])
    node = detail[0]["InstanceId"]
    answer = server.native(team).post(
        f"/api/v1/clusters/private/nodes/{node}/exec", {"Command": ["id", "-u"]}
    )
    assert answer["Stdout"].strip() == "0", answer  # a container of the node image, root in its namespace
    client.delete_cluster(ClusterName="private")
    assert wait_until(lambda: not client.list_clusters()["ClusterSummaries"], timeout=120)
    assert PASSWORD not in server.log()
