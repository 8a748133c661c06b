"""Issue 50's soft landing with runtime podman: a node in a container runs its group's on_reclaim.sh in
that container at the reclaim, and not when its user scales the group down (tests/server/test_soft_landing.py
shows it for host processes). What the hook did is read as its user would: its node's lifecycle log."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, contained_server, podman
from tests.containers.test_walkthroughs_in_containers import CONTAINERS
from tests.harness import Server, wait_until
from tests.server.test_soft_landing import EXPIRY, SMALL_FLEET, _buy, _group, _lifecycle_log, _nodes

pytestmark = pytest.mark.containers

# Root in the container's /root/lifecycle: where the hook runs in the node's container (on the host it
# would run as the account's own user in the node's home under the work directory).
ON_RECLAIM = f'#!/bin/sh\necho "on_reclaim: ${EXPIRY} uid=$(id -u) in $(pwd)"\n'


@pytest.fixture
def server(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, PodmanStore]]:
    store = PodmanStore(tmp_path_factory.mktemp("reclaim-store"))
    extra = CONTAINERS.format(registry=built.registry, store=store.root, node_image=built.python)
    with contained_server(store, SMALL_FLEET.read_text() + extra) as server:
        source = server.data_dir / "s3" / "lifecycle" / "src"
        source.mkdir(parents=True)
        (source / "on_create.sh").write_text("#!/bin/sh\necho created\n")
        (source / "on_reclaim.sh").write_text(ON_RECLAIM)
        yield server, store


def test_a_container_nodes_on_reclaim_runs_in_it_at_the_reclaim_and_not_at_a_scale_down(
    server: tuple[Server, PodmanStore],
) -> None:
    small, store = server
    plan = _buy(small, "landing", 2, "hyperpod-cluster")
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="landing",
        InstanceGroups=[_group(2, plan["TrainingPlanArn"])],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-00000000000000a01"]},
    )
    small.set_clock(plan["StartTime"] + timedelta(minutes=5))
    assert wait_until(lambda: list(_nodes(small).values()) == ["Running", "Running"], 300), _nodes(small)
    both = set(_nodes(small))

    client.update_cluster(ClusterName="landing", InstanceGroups=[_group(1, plan["TrainingPlanArn"])])
    assert wait_until(lambda: len(_nodes(small)) == 1, 120), _nodes(small)
    (kept,) = _nodes(small)
    (dropped,) = both - {kept}
    assert wait_until(lambda: len(_pods(store)) == 1, 120), _pods(store)  # the dropped node's went

    small.set_clock(plan["EndTime"] - timedelta(minutes=30))  # the segment's reclaim time
    assert wait_until(lambda: not _nodes(small) and not _pods(store), 120), (_nodes(small), _pods(store))
    end = int(plan["EndTime"].timestamp())
    hooks = [line for line in _lifecycle_log(small, kept) if line.startswith("on_reclaim")]
    assert hooks == [f"on_reclaim: {end} uid=0 in /root/lifecycle"], _lifecycle_log(small, kept)
    assert not any("on_reclaim" in line for line in _lifecycle_log(small, dropped))


def _pods(store: PodmanStore) -> list[str]:
    return podman(store, "pod", "ps", "--format", "{{.Name}}").stdout.split()
