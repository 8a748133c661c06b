"""A real Slurm cluster on this host (`scripts/slurm-dev-cluster`), and the adapter against it.

Needs root (the script installs Slurm with apt-get and starts its daemons as root): elsewhere these
tests skip, saying so; CI is root, so there a cluster that cannot be installed or started fails them.
The cluster lives under a 0711 directory made under /tmp (pytest's temporary directories are 0700, which
the script refuses, as the accounts' users could not reach slurm.conf there), and `down` runs even when
a test fails. Every daemon carries this test run's mark (tests/leaks.py) and the script's own, so
nothing escapes `down` unseen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.slurm.client import SlurmError
from hyperplan.slurm.devcluster import MARK_VARIABLE, NODES
from tests.slurm.cluster import Cluster, dev_cluster, reachable_directory

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: installs Slurm and runs its daemons as root"),
]

P5, G5 = ("ml.p5.48xlarge",), ("ml.g5.12xlarge",)


def processes_marked_with(directory: Path) -> list[int]:
    mark = f"{MARK_VARIABLE}={directory}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_up_status_down(tmp_path: Path) -> None:
    root = reachable_directory()
    directory = root / "c"
    try:
        assert dev_cluster("status", directory).returncode == 3
        first = dev_cluster("up", directory)
        assert first.returncode == 0, first.stderr
        assert first.stdout == f"export SLURM_CONF={directory}/slurm.conf\n"
        assert dev_cluster("status", directory).returncode == 0
        daemons = sorted(processes_marked_with(directory))
        programs = sorted(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in daemons)
        # slurmctld forks slurmscriptd (22.05), which names itself ": slurmscriptd"
        assert programs == [b": slurmscriptd", b"munged", b"slurmctld", *[b"slurmd"] * 8]
        again = dev_cluster("up", directory)
        assert (again.returncode, again.stdout) == (0, first.stdout)
        assert sorted(processes_marked_with(directory)) == daemons  # nothing changed

        fleet = parse_fleet((directory / "fleet.toml").read_text())
        assert fleet.backend.kind == "slurm"
        assert fleet.backend.slurm_conf == str(directory / "slurm.conf")
        assert [(p.instance_type, p.nodes, p.feature) for p in fleet.pools] == [
            ("ml.p5.48xlarge", NODES[:4], "ml.p5.48xlarge"),
            ("ml.g5.12xlarge", NODES[4:], "ml.g5.12xlarge"),
        ]

        down = dev_cluster("down", directory)
        assert down.returncode == 0, down.stderr
        assert dev_cluster("status", directory).returncode == 3
        assert processes_marked_with(directory) == []
        assert dev_cluster("down", directory).returncode == 0  # nothing runs: still fine
    finally:
        dev_cluster("down", directory)
        shutil.rmtree(root, ignore_errors=True)

    closed = tmp_path / "closed"  # pytest's base directory is 0700
    refused = dev_cluster("up", closed)
    assert refused.returncode == 1
    assert "is not reachable by other users" in refused.stderr
    assert not closed.exists()


def test_the_adapter_reads_eight_idle_nodes_with_their_features(cluster: Cluster) -> None:
    nodes = cluster.client.nodes()
    assert nodes == cluster.client.sinfo_nodes(partition="hp")
    assert [node.name for node in nodes] == list(NODES)
    assert {node.state for node in nodes} == {"IDLE"} and all(node.usable for node in nodes)
    assert [node.features for node in nodes] == [P5] * 4 + [G5] * 4
    assert [node.gres for node in nodes] == ["gpu:h100:8"] * 4 + ["gpu:a10g:4"] * 4
    assert {node.partitions for node in nodes} == {("hp",)}


def test_a_reservation_is_created_read_moved_and_deleted(cluster: Cluster) -> None:
    client = cluster.client
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    end = start + timedelta(days=1)
    name = "hp-111111111111-plan-rc1"
    made = client.create_reservation(name, users=["nobody"], nodes=["hp-n02", "hp-n03"], start=start, end=end)
    try:
        assert (made.name, made.nodes, made.users) == (name, ("hp-n02", "hp-n03"), ("nobody",))
        assert (made.start, made.end, made.state) == (start, end, "INACTIVE")
        assert client.reservation(name) == made
        assert made in client.reservations()

        moved = client.update_reservation(name, end=end + timedelta(hours=12))
        assert (moved.start, moved.end, moved.nodes) == (start, end + timedelta(hours=12), made.nodes)

        with pytest.raises(SlurmError) as overlap:  # the same node at the same time: refused
            client.create_reservation("hp-other", users=["root"], nodes=["hp-n03"], start=start, end=end)
        assert "scontrol create reservation ReservationName=hp-other" in str(overlap.value)
        assert overlap.value.detail  # Slurm's own words
        assert client.reservation("hp-other") is None
    finally:
        client.delete_reservation(name)
    assert client.reservation(name) is None


def test_a_node_is_drained_and_resumed(cluster: Cluster) -> None:
    client = cluster.client
    client.drain(["hp-n08"], "fan failure on tray 2")
    (drained,) = client.nodes(["hp-n08"])
    assert "DRAIN" in drained.flags and drained.reason == "fan failure on tray 2" and not drained.usable
    client.resume(["hp-n08"])
    deadline = time.monotonic() + 30  # after a resume Slurm may show the node not responding a moment
    while not (resumed := client.nodes(["hp-n08"])[0]).usable and time.monotonic() < deadline:
        time.sleep(0.2)
    assert resumed.usable and resumed.reason is None


def test_a_held_job_is_submitted_read_and_cancelled(cluster: Cluster) -> None:
    client = cluster.client
    options = ["--hold", "--job-name=held", "--time=1", "--output=/dev/null", f"--chdir={cluster.directory}"]
    job_id = client.submit("#!/bin/sh\ntrue\n", options)
    held = client.job(job_id)
    assert held is not None and (held.name, held.state, held.user) == ("held", "PENDING", "root")
    assert any(job.id == job_id for job in client.queue())
    client.cancel(job_id)
    cancelled = client.job(job_id)
    assert cancelled is not None and cancelled.state == "CANCELLED"
    assert client.job(10**7) is None


def test_errors_name_the_command_and_what_slurm_said(cluster: Cluster) -> None:
    with pytest.raises(SlurmError) as raised:
        cluster.client.drain(["hp-n99"], "no such node")
    assert str(raised.value).startswith("scontrol update NodeName=hp-n99 State=DRAIN")
    assert raised.value.returncode == 1 and raised.value.detail


def test_another_user_reaches_the_cluster(cluster: Cluster) -> None:
    """The accounts' users read slurm.conf and talk to munge under the cluster's directory."""
    conf = f"SLURM_CONF={cluster.directory / 'slurm.conf'}"
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", "env", conf, "sinfo", "-h", "-o", "%D %t"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stdout) == (0, "8 idle\n"), result.stderr


def test_kill_node_and_start_node_refuse_what_they_cannot_do(cluster: Cluster) -> None:
    """(Killing a node's slurmd and starting it again: tests/slurm/test_work.py.)"""
    unknown = dev_cluster("kill-node", cluster.directory, "hp-n99")
    assert (
        unknown.returncode == 1
        and "no node hp-n99 in the dev cluster (its nodes: hp-n[01-08])" in unknown.stderr
    )
    running = dev_cluster("start-node", cluster.directory, "hp-n01")
    assert running.returncode == 1 and "the slurmd of hp-n01 is running already" in running.stderr
    usage = dev_cluster("kill-node", cluster.directory)
    assert usage.returncode == 2 and "kill-node|start-node DIR NODE" in usage.stderr
    assert dev_cluster("status", cluster.directory).returncode == 0
