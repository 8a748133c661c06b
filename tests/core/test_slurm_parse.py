"""The Slurm parsers on output captured from the real daemons of `scripts/slurm-dev-cluster` (Slurm
22.05.8): eight nodes, hp-n04 drained with a reason, an active and a future reservation, a running, a
failed and a pending job. Pure: no Slurm needed, so these are core tests."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from hyperplan.slurm.parse import (
    Job,
    Node,
    ParseError,
    Reservation,
    key_values,
    parse_jobs,
    parse_nodes,
    parse_reservations,
    parse_sinfo_json,
    parse_squeue_json,
)

CAPTURED = Path(__file__).parents[1] / "slurm" / "captured"
P5, G5 = ("ml.p5.48xlarge",), ("ml.g5.12xlarge",)


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_nodes_from_scontrol_and_sinfo_agree() -> None:
    nodes = parse_nodes(captured("show_node.txt"))
    assert nodes == parse_sinfo_json(captured("sinfo.json"))
    assert [node.name for node in nodes] == [f"hp-n0{i}" for i in range(1, 9)]
    assert nodes[0] == Node("hp-n01", "IDLE", frozenset(), P5, "gpu:h100:8", ("hp",), None)
    assert nodes[2].state == "MIXED"  # a one-CPU job runs on it
    assert nodes[3] == Node(
        "hp-n04", "IDLE", frozenset({"DRAIN"}), P5, "gpu:h100:8", ("hp",), "disk failed on slot 3"
    )
    assert nodes[7] == Node("hp-n08", "IDLE", frozenset(), G5, "gpu:a10g:4", ("hp",), None)
    assert [node.usable for node in nodes] == [True, True, True, False, True, True, True, True]


def test_reservations() -> None:
    future, active = parse_reservations(captured("show_reservation.txt"))
    assert future == Reservation(
        name="hp-222222222222-plan-b-rc1",
        nodes=("hp-n05", "hp-n06"),
        start=datetime(2026, 12, 2, 11, 30, tzinfo=UTC),
        end=datetime(2026, 12, 3, 11, 30, tzinfo=UTC),
        users=("root", "nobody"),
        flags=frozenset({"SPEC_NODES"}),
        state="INACTIVE",
    )
    assert active.nodes == ("hp-n01", "hp-n02")
    assert active.start == datetime(2026, 11, 30, 22, 54, 12, tzinfo=UTC)  # StartTime=now, as Slurm saw it
    assert active.flags == {"IGNORE_JOBS", "SPEC_NODES"}
    assert (active.users, active.state) == (("nobody",), "ACTIVE")


def test_jobs_from_scontrol_and_squeue_agree() -> None:
    jobs = parse_jobs(captured("show_job.txt"))
    assert jobs == parse_squeue_json(captured("squeue.json"))
    assert jobs == (
        Job(1, "run-ok", "RUNNING", "root", ("hp-n03",), None, 0, 0),
        Job(2, "bad-exit", "FAILED", "root", ("hp-n05",), None, 3, 0),  # squeue's wait status 768
        Job(3, "future", "PENDING", "root", (), "hp-222222222222-plan-b-rc1", 0, 0),
    )
    # scontrol says when a job started and when its time limit ends it (on-demand limits follow them)
    assert (jobs[0].start, jobs[0].end) == (
        datetime(2026, 11, 30, 22, 53, 58, tzinfo=UTC),
        datetime(2026, 11, 30, 22, 58, 58, tzinfo=UTC),
    )
    assert (jobs[2].start, jobs[2].end) == (None, None)  # StartTime=Unknown EndTime=Unknown


def test_values_with_spaces_continue_until_the_next_key() -> None:
    line = (
        "NodeName=n1 OS=Linux 6.1 #1 SMP  State=DOWN+NOT_RESPONDING "
        "Reason=no answer [slurm@2026-01-01T00:00:00]"
    )
    assert key_values(line) == {
        "NodeName": "n1",
        "OS": "Linux 6.1 #1 SMP",
        "State": "DOWN+NOT_RESPONDING",
        "Reason": "no answer [slurm@2026-01-01T00:00:00]",
    }
    (node,) = parse_nodes(line)
    assert (node.state, node.flags, node.reason, node.usable) == (
        "DOWN",
        {"NOT_RESPONDING"},
        "no answer",
        False,
    )
    assert key_values("AllocNode:Sid=localhost:11389 CPUs/Task=1 Power=") == {
        "AllocNode:Sid": "localhost:11389",
        "CPUs/Task": "1",
        "Power": "",
    }


def test_nothing_to_show_is_an_empty_list() -> None:
    assert parse_reservations("No reservations in the system\n") == ()
    assert parse_jobs("No jobs in the system\n") == ()


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (
            parse_reservations,
            "ReservationName=r StartTime=soon EndTime=x State=ACTIVE",
            "'soon' is not a Slurm time",
        ),
        (parse_reservations, "ReservationName=r State=ACTIVE", "without StartTime"),
        (parse_nodes, "NodeName=n1 Arch=x86_64", "without State"),
        (parse_jobs, "JobId=7 JobState=FAILED UserId=u(1) ExitCode=x:0", "ExitCode='x:0'"),
        (parse_sinfo_json, "not json", "printed no JSON"),
        (parse_sinfo_json, '{"nodes": [{"state": "idle"}]}', "a node without 'name'"),
        (parse_squeue_json, '{"jobs": 3}', "no 'jobs' list"),
        (parse_squeue_json, '{"jobs": [], "errors": [{"error": "boom"}]}', "reported errors"),
    ],
)
def test_unreadable_output_is_a_parse_error_naming_what(parse: object, text: str, message: str) -> None:
    assert callable(parse)
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text)
