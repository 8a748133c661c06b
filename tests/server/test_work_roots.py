"""One store per work root (services/accounts/work_root.py), with real servers.

As root, two servers of different stores on their default work roots (BASE/<store id>, under the real
/var/lib/hyperplan/work) each run a cluster node and a training job numbered 1: neither touches the
other's. A server of another store given a used work root refuses to start, naming it and its store. A
store upgraded from a version before store ids (a server on the old default root, then its store id and
the root's marker taken away) adopts its running node and job from the old root once restarted on the
default, while a new store on the same machine leaves that root alone. (Two servers of one PostgreSQL
store share their root: tests/server/test_several_servers.py. The rules alone: tests/services/
test_work_root.py.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from hyperplan.services.accounts import work_root
from hyperplan.store import settings
from tests.harness import Server, free_port, healthy, wait_until

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
M5 = "ml.m5.12xlarge"  # on-demand in the small fleet
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"
BUCKET = "roots"  # made by hand in the data directory: the administrators'

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a default work root under the work base is a server run as root's"
)


# -- what the servers run ------------------------------------------------------------------------------


def _with_bucket(server: Server) -> Server:
    """The bucket the lifecycle script comes from and the models go to."""
    script = server.data_dir / "s3" / BUCKET / "src" / "on_create.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/sh\ntrue\n")
    return server


def _running_node(server: Server, cluster: str) -> str:
    client = server.sagemaker()
    client.create_cluster(
        ClusterName=cluster,
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": M5,
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": f"s3://{BUCKET}/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
            }
        ],
    )
    found = wait_until(lambda: _nodes(server, cluster).get("Running"), timeout=120)
    assert found, f"{_nodes(server, cluster)}\n{server.log()[-3000:]}"
    return str(found[0])


def _nodes(server: Server, cluster: str) -> dict[str, list[str]]:
    """The cluster's instance ids by status."""
    listed = server.sagemaker().list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    by_status: dict[str, list[str]] = {}
    for node in listed:
        by_status.setdefault(node["InstanceStatus"]["Status"], []).append(node["InstanceId"])
    return by_status


def _start_job(server: Server, name: str, script: str) -> None:
    server.sagemaker().create_training_job(
        TrainingJobName=name,
        RoleArn=ROLE,
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": IMAGE,
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": [script],
        },
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/output"},
        ResourceConfig={"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )


def _waiting_for(release: Path) -> str:
    return f"until [ -e {release} ]; do sleep 0.1; done"


def _job(server: Server, name: str) -> dict[str, Any]:
    return dict(server.sagemaker().describe_training_job(TrainingJobName=name))


def _training(server: Server, name: str) -> None:
    """The job's instance runs (a process under the work root, for an adoption to find or end)."""
    job = wait_until(lambda: (d := _job(server, name))["SecondaryStatus"] == "Training" and d, timeout=120)
    assert job, f"{_job(server, name)}\n{server.log()[-3000:]}"


def _completed(server: Server, name: str) -> None:
    final = ("Completed", "Failed", "Stopped")
    job = wait_until(lambda: (d := _job(server, name))["TrainingJobStatus"] in final and d, timeout=120)
    assert job, f"{name} did not end:\n{server.log()[-3000:]}"
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")


# -- the store and its root ----------------------------------------------------------------------------


def _store_url(server: Server) -> str:
    return server.database_url or f"sqlite:///{server.data_dir / 'hyperplan.db'}"


def _store_id(server: Server) -> str | None:
    """The store's id as its settings hold it; None before the first start made it."""
    if server.database_url is None and not (server.data_dir / "hyperplan.db").exists():
        return None
    engine = create_engine(_store_url(server))
    try:
        with engine.connect() as connection:
            found = connection.execute(
                text("SELECT value FROM settings WHERE key = :key"), {"key": settings.STORE_ID}
            ).scalar_one_or_none()
    finally:
        engine.dispose()
    return str(found) if found is not None else None


def _forget_store_id(server: Server) -> None:
    """The store as a version before store ids left it."""
    engine = create_engine(_store_url(server))
    try:
        with engine.begin() as connection:
            connection.execute(
                text("DELETE FROM settings WHERE key IN (:id, :predates)"),
                {"id": settings.STORE_ID, "predates": settings.STORE_PREDATES_IDS},
            )
    finally:
        engine.dispose()


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _default_root(server: Server, base: Path) -> Path:
    store_id = _store_id(server)
    assert store_id is not None
    return base / store_id


@pytest.fixture
def real_base_roots(server_factory: type[Server]) -> Iterator[list[Server]]:
    """Servers on their default work roots under the real base (/var/lib/hyperplan/work): after the
    test, whatever happened, each server and everything it started is ended, then its root removed, and
    the base and its parent too if the test made them (and they are empty). (After the test, and before
    `server_factory` closes its servers again: it is set up first.)"""
    base = work_root.DEFAULT_BASE
    made_here = [path for path in (base, base.parent) if not path.exists()]
    servers: list[Server] = []
    try:
        yield servers
    finally:
        for server in servers:
            server.close()
        for server in servers:
            store_id = None
            with contextlib.suppress(Exception):  # unreadable: its id, and so its root, unknown here
                store_id = _store_id(server)
            if store_id is not None and re.fullmatch(r"[0-9a-f]{32}", store_id):
                shutil.rmtree(base / store_id, ignore_errors=True)
        for path in made_here:
            with contextlib.suppress(OSError):  # another's root (a server run beside the tests) keeps it
                path.rmdir()


# -- the tests ----------------------------------------------------------------------------------------


@pytest.mark.isolation
@as_root
def test_two_stores_on_their_default_work_roots_never_touch_each_other_s_work(
    server_factory: type[Server],
    tmp_path: Path,
    real_base_roots: list[Server],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(work_root.BASE_VARIABLE, raising=False)  # the real base
    release = tmp_path / "release"
    first, second = (
        _with_bucket(server_factory(data_dir=tmp_path / name, fleet=SMALL_FLEET, default_work_dir=True))
        for name in ("first", "second")
    )
    real_base_roots += [first, second]
    first.start()
    first_node = _running_node(first, "cluster")
    _start_job(first, "job", _waiting_for(release))  # job 1 of its store
    _training(first, "job")
    second.start()  # its leader adopts its own root only
    _running_node(second, "cluster")
    _start_job(second, "job", _waiting_for(release))  # job 1 of its store too
    _training(second, "job")
    assert _nodes(first, "cluster") == {"Running": [first_node]}  # the second's start ended nothing
    assert _job(first, "job")["SecondaryStatus"] == "Training"
    roots = [_default_root(server, work_root.DEFAULT_BASE) for server in (first, second)]
    assert roots[0] != roots[1]
    for server, root in zip((first, second), roots, strict=True):
        assert work_root.owner_of(root) == root.name == _store_id(server)
        assert (root / "jobs" / "1" / "attempt-1" / "algo-1").is_dir()  # one job number, two trees
    release.touch()
    for server in (first, second):
        _completed(server, "job")
        assert list(_nodes(server, "cluster")) == ["Running"]


def test_a_server_of_another_store_refuses_a_used_work_root_naming_it_and_its_store(
    server_factory: type[Server], tmp_path: Path
) -> None:
    work = tmp_path / "shared-work"
    first = server_factory(data_dir=tmp_path / "first", extra_args=("--work-dir", str(work))).start()
    owner = work_root.owner_of(work)
    assert owner is not None and owner == _store_id(first)
    second = server_factory(data_dir=tmp_path / "second", extra_args=("--work-dir", str(work)))
    with pytest.raises(RuntimeError, match="server exited with 2"):
        second.start()
    said = _squeezed(second.log())  # as printed, folded at the terminal's width
    assert _squeezed(f"StartRefused: work directory {work} belongs to another store") in said, said
    assert _squeezed(f"names store {owner}, and this server's store is {_store_id(second)}") in said
    assert _squeezed("a work directory of its own (--work-dir, or [backend] work_dir") in said
    assert work_root.owner_of(work) == owner
    assert healthy(first.port)


@pytest.mark.isolation
@as_root
def test_a_store_from_before_store_ids_adopts_its_node_and_job_from_the_old_default_root(
    server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"  # the old default root, and the base of the new ones
    monkeypatch.setenv(work_root.BASE_VARIABLE, str(base))
    release = tmp_path / "release"
    old_style = ("--work-dir", str(base))
    server = _with_bucket(server_factory(data_dir=tmp_path / "data", fleet=SMALL_FLEET, extra_args=old_style))
    server.start()
    node = _running_node(server, "cluster")
    _start_job(server, "old", _waiting_for(release))
    _training(server, "old")
    server.stop()  # its node and its job's instance run on
    _forget_store_id(server)
    (base / work_root.MARKER_NAME).unlink()
    assert work_root.holds_old_work(base)

    # A store made since, on the default, neither claims nor adopts that root.
    newcomer = server_factory(
        data_dir=tmp_path / "newcomer", fleet=SMALL_FLEET, default_work_dir=True
    ).start()
    assert work_root.owner_of(base) is None
    assert work_root.owner_of(_default_root(newcomer, base)) == _store_id(newcomer)
    newcomer.stop()

    server.extra_args, server.default_work_dir, server.port = (), True, free_port()
    server.start()
    assert _nodes(server, "cluster") == {"Running": [node]}  # adopted, not lost
    assert _job(server, "old")["SecondaryStatus"] == "Training"
    said = "".join(server.log().split())  # (the log's lines may be folded)
    assert "adoptingthenodesandtasksapreviousversionstartedunder" + str(base / "backend") in said
    store_id = _store_id(server)
    assert store_id is not None and work_root.owner_of(base) == store_id  # claimed as the store's own
    own = base / store_id
    assert work_root.owner_of(own) == store_id
    exec_path = f"/api/v1/clusters/cluster/nodes/{node}/exec"
    assert server.native().post(exec_path, {"Command": ["true"]})["ExitCode"] == 0  # served there
    _start_job(server, "new", "true")
    _completed(server, "new")
    assert (own / "jobs" / "2" / "attempt-1" / "algo-1").is_dir()  # new work in the store's own root
    release.touch()
    _completed(server, "old")
    assert (base / "jobs" / "1" / "attempt-1" / "algo-1").is_dir()  # the old job kept its tree
