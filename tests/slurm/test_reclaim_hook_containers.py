"""A container node's on_reclaim.sh on the Slurm back end (issue 50, docs/DECISIONS.md "Reclaim hook"): at
its plan's reclaim time the node's batch script runs the hook in a container of the node's image, as its
OnCreate ran there (root inside, in the lifecycle copy at /root/lifecycle, the published expiry), its
output in the node's lifecycle log; a node let go at a scale-down runs none.

A real `hyperplan serve` on the contained fleet (runtime podman on Slurm, tests/slurm/contained.py) under the
manual clock (tests/slurm/test_containers.py's contained_server; the slurm_server fixture takes the server,
its accounts' users, their Slurm jobs and the `hp-` reservations away after the test)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

import pytest

from hyperplan.signing import Credentials
from tests.harness import SERVER_START, Server, boundary_after, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.contained import container_states
from tests.slurm.test_containers import READY, contained_server
from tests.slurm.test_reclaim_hook import EXPIRY, _group, _lifecycle_log
from tests.slurm.test_reservations import DAY, WAIT, _user_of, slurm_server
from tests.slurm.test_several_plans import _buy
from tests.slurm.test_work import _jobs_of

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: Slurm's daemons, Podman and the accounts' users"
    ),
]
__all__ = ["contained_server", "slurm_server"]  # the fixtures, shared

ON_CREATE = "#!/bin/sh\necho created\n"
# Root in /root/lifecycle: the node's container (on the host the hook would run as the account's own user
# in the node's home under the work root).
ON_RECLAIM = f'#!/bin/sh\necho "on_reclaim: ${EXPIRY} uid=$(id -u) in $(pwd)"\n'


def _running(server: Server, who: Credentials) -> set[str]:
    nodes = server.sagemaker(who).list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
    return {n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}


def _nodes(server: Server, who: Credentials) -> set[str]:
    nodes = server.sagemaker(who).list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
    return {n["InstanceId"] for n in nodes}


def test_a_container_nodes_on_reclaim_runs_in_its_image_at_the_reclaim_and_not_at_a_scale_down(
    contained_server: Callable[[], Server], cluster: Cluster
) -> None:
    server = contained_server()
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team = server.new_account("team")
    _, user = _user_of(server, "team")
    plan = _buy(server, team, "landing", 2, first_day, 1)
    source = server.data_dir / "s3" / "lifecycle" / "src"
    source.mkdir(parents=True)
    (source / "on_create.sh").write_text(ON_CREATE)
    (source / "on_reclaim.sh").write_text(ON_RECLAIM)
    server.cli("buckets", "grant", "lifecycle", "team")
    client = server.sagemaker(team)
    client.create_cluster(ClusterName="c", InstanceGroups=[_group(2, plan)])

    server.set_clock(first_day + timedelta(minutes=1))
    assert wait_until(lambda: len(_running(server, team)) == 2, timeout=READY), (
        client.list_cluster_nodes(ClusterName="c"),
        server.log()[-3000:],
    )
    both = _running(server, team)

    # A scale-down: the node goes, its plan's capacity not taken back, so no hook runs.
    client.update_cluster(ClusterName="c", InstanceGroups=[_group(1, plan)])
    assert wait_until(lambda: len(_nodes(server, team)) == 1, timeout=WAIT), _nodes(server, team)
    (kept,) = _nodes(server, team)
    (dropped,) = both - {kept}
    assert wait_until(lambda: len(_jobs_of(cluster, user)) == 1, timeout=WAIT), _jobs_of(cluster, user)

    # The reclaim: the kept node's hook runs once, in its image as root inside, with the segment's end.
    server.set_clock(first_day + DAY - timedelta(minutes=30))
    assert wait_until(lambda: not _nodes(server, team), timeout=WAIT), _nodes(server, team)
    assert wait_until(lambda: not _jobs_of(cluster, user), timeout=WAIT), _jobs_of(cluster, user)
    end = int((first_day + DAY).timestamp())
    log = _lifecycle_log(server, team, kept)
    assert [line for line in log if line.startswith("on_reclaim")] == [
        f"on_reclaim: {end} uid=0 in /root/lifecycle"
    ], (log, server.log()[-3000:])
    assert "created" in log  # the same stream as its OnCreate's
    assert not any("on_reclaim" in line for line in _lifecycle_log(server, team, dropped))
    assert wait_until(lambda: not container_states(server), timeout=WAIT), container_states(server)
