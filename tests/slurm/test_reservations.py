"""Plans as Slurm reservations, against the dev cluster (docs/SLURM.md): a real `hyperplan serve` on the
Slurm back end, in isolation mode users (the Slurm back end runs all work as the accounts' users), with
the cluster's fleet (two pools of four nodes: hp-n[01-04] ml.p5.48xlarge, hp-n[05-08] ml.g5.12xlarge).

Each test buys the same shape: account `other` holds the four p5 nodes on the second day, so account
`team`'s two days become two segments around it, rc1 on the first day and rc2 on the third. Every
server, its accounts' users and the `hp-` reservations go with the test, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.errors import StartRefused
from hyperplan.services.accounts.os_users import exists
from hyperplan.services.slurm.slurm_reservations import check_cluster
from hyperplan.signing import Credentials
from hyperplan.slurm.client import SlurmError
from hyperplan.slurm.devcluster import NODES
from hyperplan.slurm.parse import Reservation
from tests.harness import SERVER_START, Server, boundary_after, wait_until
from tests.slurm.cluster import Cluster, dev_cluster, reachable_directory

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]

P5 = "ml.p5.48xlarge"
P5_NODES = set(NODES[:4])
DAY = timedelta(days=1)
WAIT = 30.0  # a reconciling pass runs on every plan event and every 2 s


@pytest.fixture
def slurm_server(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []
    open_dir = reachable_directory("hp-slurm-work-")

    def start(clock: str, fleet: Path | None = None) -> Server:
        """A server on the dev cluster's fleet (or a variant of it, on the same nodes)."""
        server = Server(
            data_dir=tmp_path / "data",
            clock=clock,
            clock_start=SERVER_START if clock != "wall" else None,
            fleet=fleet or cluster.fleet,
            extra_args=("--isolation", "users", "--work-dir", str(open_dir / "work")),
        )
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            users = [a["OsUser"] for a in _accounts(server) if a.get("OsUser")] if server.process else []
            server.close()
            for user in users:  # its Slurm jobs first (a job holds its reservation and its user)
                with contextlib.suppress(SlurmError):  # (a test may have removed the user already)
                    cluster.client.run("scancel", "--full", "--signal=KILL", f"--user={user}")
                    cluster.client.run("scancel", f"--user={user}")
            for user in users:
                subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
            assert not [user for user in users if exists(user)]
        for reservation in cluster.client.reservations():
            if reservation.name.startswith("hp-"):
                cluster.client.delete_reservation(reservation.name)
        for node in cluster.client.nodes():
            if "DRAIN" in node.flags:
                _resume(cluster, node.name)
        subprocess.run(["rm", "-rf", str(open_dir)], check=False)


def _resume(cluster: Cluster, node: str) -> None:
    """Resume a drained node. Slurm 22.05 answers "Invalid node state specified" to the first resume
    after slurmctld restarted, yet resumes the node: what counts is that it is no longer drained."""
    with contextlib.suppress(SlurmError):
        cluster.client.resume([node])
    wait_until(lambda: "DRAIN" not in cluster.client.nodes([node])[0].flags, timeout=WAIT)
    assert "DRAIN" not in cluster.client.nodes([node])[0].flags


def _accounts(server: Server) -> list[dict[str, Any]]:
    accounts: list[dict[str, Any]] = server.native().get("/api/v1/accounts")["Accounts"]
    return accounts


def _user_of(server: Server, name: str) -> tuple[str, str]:
    account = next(a for a in _accounts(server) if a["Name"] == name)
    return account["AccountId"], account["OsUser"]


def _buy(
    server: Server,
    who: Credentials,
    name: str,
    count: int,
    hours: int,
    after: datetime,
    before: datetime,
    instance_type: str = P5,
) -> dict[str, Any]:
    client = server.sagemaker(who)
    offerings = client.search_training_plan_offerings(
        InstanceType=instance_type,
        InstanceCount=count,
        DurationHours=hours,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=after,
        EndTimeBefore=before,
    )["TrainingPlanOfferings"]
    assert offerings, f"no offering for {name}"
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"]
    )
    plan: dict[str, Any] = client.describe_training_plan(TrainingPlanName=name)
    return plan


def _split_plan(server: Server, first_day: datetime) -> tuple[Credentials, Credentials, dict[str, Any]]:
    """`other` holds all four p5 nodes on the second day; `team` buys two nodes for two days in the
    first three: two segments, rc1 on the first day and rc2 on the third."""
    team, other = server.new_account("team"), server.new_account("other")
    _buy(server, other, "blocker", 4, 24, first_day + DAY, first_day + 2 * DAY)
    plan = _buy(server, team, "split", 2, 48, first_day, first_day + 3 * DAY)
    segments = [(s["StartTime"], s["EndTime"]) for s in plan["ReservedCapacitySummaries"]]
    assert segments == [(first_day, first_day + DAY), (first_day + 2 * DAY, first_day + 3 * DAY)]
    assert plan["Status"] == "Scheduled"
    return team, other, plan


def _held(cluster: Cluster) -> dict[str, Reservation]:
    return {r.name: r for r in cluster.client.reservations() if r.name.startswith("hp-")}


def _until(cluster: Cluster, check: Callable[[dict[str, Reservation]], bool]) -> dict[str, Reservation]:
    held: dict[str, Reservation] = {}

    def look() -> bool:
        nonlocal held
        held = _held(cluster)
        return check(held)

    wait_until(look, timeout=WAIT)
    assert check(held), f"Slurm holds {held}"
    return held


def _events(server: Server, account: str, plan: str, kind: str, count: int = 1) -> list[str]:
    """The messages of the plan's events of `kind`, once there are `count` (each pass records what it
    did after its Slurm calls)."""

    wait_until(lambda: len(_messages(server, account, plan, kind)) >= count, timeout=WAIT)
    found = _messages(server, account, plan, kind)
    assert len(found) == count, found
    return found


def _messages(server: Server, account: str, plan: str, kind: str) -> list[str]:
    events = server.native().get(f"/api/v1/plans/{plan}/events", account=account)["Events"]
    return [e["Message"] for e in events if e["Kind"] == kind]


def test_a_plan_is_reservations_from_scheduled_to_cancelled_under_the_wall_clock(
    cluster: Cluster, slurm_server: Callable[..., Server]
) -> None:
    server = slurm_server("wall")
    first_day = boundary_after(datetime.now(UTC) + timedelta(hours=1))
    # Work outside reservations, without a time limit, runs on a p5 node before the plans are bought.
    options = ["-N1", "--exclusive", "-w", "hp-n01", "--time=UNLIMITED", "--output=/dev/null"]
    on_demand = cluster.client.submit("#!/bin/sh\nsleep 600\n", options)
    try:
        assert wait_until(lambda: _job_state(cluster, on_demand) == "RUNNING", timeout=WAIT)
        _a_plan_from_scheduled_to_cancelled(cluster, server, first_day, on_demand)
    finally:
        cluster.client.cancel(on_demand)


def _job_state(cluster: Cluster, job_id: int) -> str | None:
    job = cluster.client.job(job_id)
    return job.state if job is not None else None


def _a_plan_from_scheduled_to_cancelled(
    cluster: Cluster, server: Server, first_day: datetime, on_demand: int
) -> None:
    team, _other, plan = _split_plan(server, first_day)
    team_id, team_user = _user_of(server, "team")
    other_id, other_user = _user_of(server, "other")
    rc1, rc2 = f"hp-{team_id}-split-rc1", f"hp-{team_id}-split-rc2"
    blocker = f"hp-{other_id}-blocker-rc1"

    held = _until(cluster, lambda h: {rc1, rc2, blocker} <= h.keys())
    # Made though that work runs on hp-n01 (IGNORE_JOBS); rc1 keeps off the busy node, and the work's
    # time limit is cut to end two minutes before the first reservation on its node (the blocker's).
    assert "hp-n01" not in held[rc1].nodes and "hp-n01" in held[blocker].nodes
    assert "IGNORE_JOBS" in held[blocker].flags
    cut = lambda: (job := cluster.client.job(on_demand)) is not None and job.end  # noqa: E731
    assert wait_until(cut, timeout=WAIT), cluster.client.job(on_demand)
    limit_end = cluster.client.job(on_demand).end  # type: ignore[union-attr]
    assert limit_end is not None
    assert first_day + DAY - timedelta(minutes=3) < limit_end <= first_day + DAY - timedelta(minutes=2)
    assert _job_state(cluster, on_demand) == "RUNNING"
    for name, (start, end) in (
        (rc1, (first_day, first_day + DAY)),
        (rc2, (first_day + 2 * DAY, first_day + 3 * DAY)),
    ):
        reservation = held[name]
        assert (reservation.start, reservation.end, reservation.users) == (start, end, (team_user,))
        assert len(reservation.nodes) == 2 and set(reservation.nodes) <= P5_NODES
        assert reservation.state == "INACTIVE"
    assert set(held[blocker].nodes) == P5_NODES and held[blocker].users == (other_user,)
    made = _events(server, "team", "split", "slurm-reservation-made", 2)
    assert sorted(message.split()[2] for message in made) == [rc1, rc2]

    # Only the account's user may submit into its reservations: Slurm itself refuses another account's.
    refused = subprocess.run(
        ["runuser", "-u", other_user, "--", "sbatch", f"--reservation={rc1}", "--hold", "-N1", "--time=1",
         "--output=/dev/null", "--wrap=true"],
        env={**os.environ, "SLURM_CONF": str(cluster.conf)},
        capture_output=True, text=True, timeout=30, cwd="/tmp",
    )  # fmt: skip
    assert refused.returncode != 0 and "Access denied" in refused.stderr, refused

    # An extension moves the last reservation's end, and the time limit of the jobs in it with it.
    waiting = subprocess.run(
        ["runuser", "-u", team_user, "--", "sbatch", "--parsable", f"--reservation={rc2}", "--hold", "-N1",
         "--time=60", "--output=/dev/null", "--wrap=true"],
        env={**os.environ, "SLURM_CONF": str(cluster.conf)},
        capture_output=True, text=True, timeout=30, cwd="/tmp",
    )  # fmt: skip
    assert waiting.returncode == 0, waiting.stderr
    job_id = waiting.stdout.strip().split(";")[0]
    client = server.sagemaker(team)
    [offer] = client.search_training_plan_offerings(
        TrainingPlanArn=plan["TrainingPlanArn"], DurationHours=24
    )["TrainingPlanExtensionOfferings"]
    client.extend_training_plan(TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"])
    moved = _until(cluster, lambda h: rc2 in h and h[rc2].end == first_day + 4 * DAY)
    assert moved[rc2].nodes == held[rc2].nodes and moved[rc2].start == first_day + 2 * DAY
    [followed] = _events(server, "team", "split", "slurm-jobs-time-moved")
    assert f"{job_id} in reservation {rc2}: time limit moved by +1440 minute(s)" in followed
    limit = cluster.client.run("scontrol", "show", "job", job_id, "-o").split("TimeLimit=")[1].split()[0]
    assert limit == "1-01:00:00"  # 60 minutes and the day the extension added
    cluster.client.cancel(int(job_id))

    # An account whose OS user is missing cannot book: its reservations could not be made for it.
    ghost = server.new_account("ghost")
    _, ghost_user = _user_of(server, "ghost")
    subprocess.run(["userdel", ghost_user], check=True, capture_output=True, timeout=60)
    with pytest.raises(ClientError) as refused_booking:
        _buy(server, ghost, "phantom", 1, 24, first_day, first_day + 2 * DAY)
    assert f"OS user {ghost_user} does not exist on this machine" in str(refused_booking.value)

    # Cancelled: its reservations go; the other account's stays.
    server.native().post(f"/api/v1/accounts/{team_id}/plans/split/cancel", {"Reason": "not needed"})
    after = _until(cluster, lambda h: rc1 not in h and rc2 not in h)
    assert blocker in after
    _events(server, "team", "split", "slurm-reservation-deleted", 2)
    # All this while, every pass placed the blocker on the same four nodes (the on-demand one last, as
    # Slurm does not list them): made once, never deleted and made again.
    _events(server, "other", "blocker", "slurm-reservation-made", 1)
    assert _messages(server, "other", "blocker", "slurm-reservation-moved") == []


def test_under_the_manual_clock_reservations_follow_segments_and_nodes(
    cluster: Cluster, slurm_server: Callable[..., Server]
) -> None:
    server = slurm_server("manual")
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    _team, _other, _plan = _split_plan(server, first_day)
    team_id, team_user = _user_of(server, "team")
    other_id, _ = _user_of(server, "other")
    rc1, rc2 = f"hp-{team_id}-split-rc1", f"hp-{team_id}-split-rc2"
    blocker = f"hp-{other_id}-blocker-rc1"

    # A segment's reservation is made when it starts, for the service time it has left.
    server.set_clock(first_day)
    held = _until(cluster, lambda h: rc1 in h)
    assert held.keys() == {rc1}
    assert held[rc1].users == (team_user,) and held[rc1].state == "ACTIVE"
    assert len(held[rc1].nodes) == 2 and set(held[rc1].nodes) <= P5_NODES
    assert held[rc1].end - held[rc1].start >= DAY - timedelta(minutes=1)

    # A node drained mid-segment is replaced by a free one of the pool; the fleet says which and why.
    failed = held[rc1].nodes[0]
    cluster.client.drain([failed], "fan failure on tray 2")
    held = _until(cluster, lambda h: rc1 in h and failed not in h[rc1].nodes and len(h[rc1].nodes) == 2)
    assert set(held[rc1].nodes) <= P5_NODES
    [replaced] = _events(server, "team", "split", "slurm-node-replaced")
    assert failed in replaced and "fan failure on tray 2" in replaced
    [p5] = [p for p in server.native().get("/api/v1/fleet")["Pools"] if p["InstanceType"] == P5]
    assert p5["UnhealthyNodes"] == [
        {"Node": failed, "State": "IDLE+DRAIN", "Reason": "fan failure on tray 2"}
    ]
    assert (p5["ReservableCount"], p5["BookableCount"]) == (4, 3)
    shown = server.cli("fleet", "show").stdout
    assert f"{failed}: IDLE+DRAIN (fan failure on tray 2)" in shown

    # Deleted by hand: made again.
    cluster.client.delete_reservation(rc1)
    held = _until(cluster, lambda h: rc1 in h)
    assert len(held[rc1].nodes) == 2 and set(held[rc1].nodes) <= P5_NODES and held[rc1].users == (team_user,)
    _events(server, "team", "split", "slurm-reservation-recreated")

    # slurmctld restarted: the reservations come back from its saved state, unchanged.
    restarted = dev_cluster("restart-controller", cluster.directory)
    assert restarted.returncode == 0, restarted.stderr
    assert _held(cluster)[rc1] == held[rc1]

    # A stray `hp-` reservation (no plan holds it) is removed.
    stray = "hp-999999999999-stray-rc1"
    cluster.client.create_reservation(
        stray, users=["root"], nodes=["hp-n08"], start="now", end=first_day + 9 * DAY
    )
    _until(cluster, lambda h: stray not in h)

    # The segment ends: its reservation goes; the next one (the other account's, four nodes) comes
    # short of the drained node, and takes it once it is back.
    server.set_clock(first_day + DAY)
    held = _until(cluster, lambda h: rc1 not in h and blocker in h)
    assert set(held[blocker].nodes) == P5_NODES - {failed}
    [short] = _events(server, "other", "blocker", "capacity-short")
    assert "short of 1 of its 4 instance(s)" in short
    _resume(cluster, failed)
    held = _until(cluster, lambda h: blocker in h and set(h[blocker].nodes) == P5_NODES)
    _events(server, "other", "blocker", "capacity-restored")
    server.set_clock(first_day + 2 * DAY)
    held = _until(cluster, lambda h: blocker not in h and rc2 in h)
    assert held.keys() == {rc2}
    server.set_clock(first_day + 3 * DAY)
    _until(cluster, lambda h: h == {})


def test_the_pools_are_checked_against_sinfo(cluster: Cluster) -> None:
    """At start: a node Slurm does not know, one without the pool's feature, or in another partition is
    refused, naming the node."""
    text = cluster.fleet.read_text()
    cases = {
        'nodes = "hp-n[01-04,09]"': "node hp-n09 is not a node of the Slurm cluster",
        'nodes = "hp-n[01-03,05]"': "node hp-n05 lacks the feature ml.p5.48xlarge",
        'partition = "gpu"': "node hp-n01 is not in partition gpu (it is in hp)",
    }
    check_cluster(cluster.client, parse_fleet(text))  # the cluster's own fleet is fine
    for change, said in cases.items():
        key = change.split(" = ")[0]
        changed = "\n".join(
            change if line.startswith(key + " = ") and ("hp-n[01-04]" in line or key == "partition") else line
            for line in text.splitlines()
        )
        if key == "nodes":  # the other pool gives up hp-n05 when the p5 pool takes it
            changed = changed.replace('nodes = "hp-n[05-08]"', 'nodes = "hp-n[06-08]"')
        with pytest.raises(StartRefused) as refused:
            check_cluster(cluster.client, parse_fleet(changed))
        assert said in refused.value.message
