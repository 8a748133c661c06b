"""The copy-paste examples of examples/ run as a user runs them (their shell scripts, the real `aws` CLI,
from the repository's root), and `make demo`'s walk, run as the Makefile runs it.

The SageMaker Python SDK's examples (examples/sdk) run in tests/server/test_sdk.py, in the sdk part."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tarfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.layout import MARK_VARIABLE
from hyperplan.cli.demo import day_window
from tests.harness import ADMIN, BIN, REGION, Server, wait_until
from tests.instants import at_awkward_instants
from tests.processes import marked

pytestmark = pytest.mark.aws  # the aws CLI's S3 beside SageMaker's API (tests/parts.py)

ROOT = Path(__file__).parent.parent.parent


def run_example(server: Server, script: str, *arguments: str, **variables: str) -> list[str]:
    """`sh examples/...` from the repository's root, as examples/README.md runs it, with the keys in the
    environment and HYPERPLAN_ENDPOINT_URL naming the server; the lines it printed."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_ENDPOINT"))}
    environment = {
        **inherited,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # the aws CLI `make` installs
        "AWS_ACCESS_KEY_ID": ADMIN.access_key,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_MAX_ATTEMPTS": "1",
        "HYPERPLAN_ENDPOINT_URL": server.url,
        **variables,
    }
    process = subprocess.run(
        ["sh", script, *arguments], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, f"{script} failed ({process.returncode}):\n{process.stderr}"
    return process.stdout.splitlines()


def bought(server: Server, name: str, target: str, count: int) -> datetime:
    """examples/buy-plan.sh's plan, checked as it prints it; its start."""
    lines = run_example(server, "examples/buy-plan.sh", name, target, str(count))
    assert lines[0].endswith(f":training-plan/{name}") and lines[1] == "Scheduled", lines
    plan = server.sagemaker().describe_training_plan(TrainingPlanName=name)
    assert plan["TotalInstanceCount"] == count and plan["TargetResources"] == [target]
    start: datetime = plan["StartTime"]
    return start


def test_the_hyperpod_example_runs_its_controller_at_once_and_its_workers_on_the_plan(server: Server) -> None:
    start = bought(server, "my-cluster-plan", "hyperpod-cluster", 2)
    created = run_example(server, "examples/hyperpod/create-cluster.sh", PLAN="my-cluster-plan")
    assert '"ClusterArn":' in "".join(created), created
    client = server.sagemaker()

    def running() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for node in client.list_cluster_nodes(ClusterName="ml-cluster")["ClusterNodeSummaries"]:
            assert node["InstanceStatus"]["Status"] != "Failure", node
            if node["InstanceStatus"]["Status"] == "Running":
                found.setdefault(node["InstanceGroupName"], []).append(node["InstanceId"])
        return found

    def groups() -> dict[str, tuple[int, int, str]]:
        described = server.aws("sagemaker", "describe-cluster", "--cluster-name", "ml-cluster")
        return {
            g["InstanceGroupName"]: (g["CurrentCount"], g["TargetCount"], g["TrainingPlanStatus"])
            for g in described["InstanceGroups"]
        }

    assert wait_until(lambda: len(running().get("controller-machine", [])) == 1, timeout=120), running()
    assert groups() == {
        "controller-machine": (1, 1, "NotApplicable"),
        "worker-group-1": (0, 2, "Scheduled"),
    }

    server.set_clock(start)
    assert wait_until(lambda: len(running().get("worker-group-1", [])) == 2, timeout=120), running()
    assert groups() == {"controller-machine": (1, 1, "NotApplicable"), "worker-group-1": (2, 2, "Active")}
    # What on_create.sh left on each node: its role, and the end of the plan's capacity (0 on demand).
    plan = client.describe_training_plan(TrainingPlanName="my-cluster-plan")
    end = plan["ReservedCapacitySummaries"][0]["EndTime"]
    nodes = running()
    roles = {
        group: server.cli("clusters", "exec", "ml-cluster", ids[0], "--", "cat", "node-role.txt").stdout
        for group, ids in nodes.items()
    }
    assert roles == {
        "controller-machine": "controller node of controller-machine, capacity until 0\n",
        "worker-group-1": f"compute node of worker-group-1, capacity until {int(end.timestamp())}\n",
    }


def test_the_training_job_example_waits_for_its_plan_and_stores_its_model(
    server: Server, tmp_path: Path
) -> None:
    start = bought(server, "my-job-plan", "training-job", 1)
    created = run_example(
        server, "examples/training-job/create-training-job.sh", PLAN="my-job-plan", JOB="first-job"
    )
    assert '"TrainingJobArn":' in "".join(created), created
    waiting = server.aws("sagemaker", "describe-training-job", "--training-job-name", "first-job")
    assert (waiting["TrainingJobStatus"], waiting["SecondaryStatus"]) == ("InProgress", "Pending")
    assert (
        "Waiting for plan my-job-plan to become Active"
        in waiting["SecondaryStatusTransitions"][-1]["StatusMessage"]
    )

    server.set_clock(start)
    client = server.sagemaker()

    def ended() -> Any:
        status = client.describe_training_job(TrainingJobName="first-job")["TrainingJobStatus"]
        return status if status in ("Completed", "Failed", "Stopped") else None

    assert wait_until(ended, timeout=120) == "Completed", client.describe_training_job(
        TrainingJobName="first-job"
    ).get("FailureReason")
    described = server.aws("sagemaker", "describe-training-job", "--training-job-name", "first-job")
    model = described["ModelArtifacts"]["S3ModelArtifacts"]
    assert model == "s3://my-team-bucket/output/first-job/output/model.tar.gz"
    copied = server.aws("s3", "cp", "--no-progress", model, str(tmp_path / "model.tar.gz"), check=False)
    assert copied.returncode == 0, copied.stderr
    with tarfile.open(tmp_path / "model.tar.gz") as archive:
        member = archive.extractfile("model.json")
        assert member is not None
        # examples/sdk/train.py on examples/training-job/numbers.csv (1..5), scale 2: twice their mean.
        assert json.loads(member.read()) == {"estimate": 6.0, "rows": 5, "hosts": ["algo-1"]}


# -- make demo ------------------------------------------------------------------------------------------


@at_awkward_instants
def test_the_demo_searches_the_first_whole_day_a_plan_bought_now_can_hold(start_instant: datetime) -> None:
    start, end = day_window(start_instant)
    first = end - timedelta(days=1)  # the day's start: an 11:30 UTC boundary, at least 30 minutes ahead
    assert start == start_instant and (first.hour, first.minute) == (11, 30)
    assert start_instant + timedelta(minutes=30) <= first < start_instant + timedelta(days=1, minutes=30)


def demo_command() -> list[str]:
    """The command line `make demo` runs, read from the Makefile, so that this test runs the same one."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index("demo: $(STAMP)") + 1]
    return [word.replace("$(BIN)", str(BIN)) for word in shlex.split(recipe)]


def printed_by(output: str, command: str) -> list[list[str]]:
    """What each run of a command the demo printed (`$ COMMAND ...`) printed in turn, one list a run."""
    runs: list[list[str]] = []
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(("$ ", "== ", "# ", "  ... ")) or not line:
            current = None
            if line.startswith(f"$ {command}"):
                current = []
                runs.append(current)
        elif current is not None:
            current.append(line)
    return runs


def test_make_demo_walks_its_plans_from_purchase_to_expired_and_leaves_nothing(tmp_path: Path) -> None:
    process = subprocess.run(
        demo_command(),
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its temporary directory goes
        capture_output=True,
        text=True,
        timeout=270,
    )
    output = process.stdout
    assert process.returncode == 0, f"{output}\n{process.stderr}"
    # Its commands are the aws CLI's and ours, against the server it started.
    assert "$ aws sagemaker create-cluster --endpoint-url http://127.0.0.1:" in output
    # It moved the clock itself, from its start (DEMO_START, 09:00) to the plans' start, their reclaim
    # time 30 minutes before their end, and their end.
    moves = [line.split()[-1] for line in output.splitlines() if line.startswith("$ hyperplan clock set")]
    assert moves == ["2027-03-01T11:30:00Z", "2027-03-02T11:00:00Z", "2027-03-02T11:30:00Z"]
    # While the plans were Active: the workers on their plan, the job trained.
    assert printed_by(output, "aws sagemaker describe-training-plan") == [["Active\t2\t0"]]
    assert printed_by(output, "hyperplan jobs logs") == [["trained on 5 rows: 6.0"]]
    # The end: both plans Expired, the job Completed, the plan's workers at 0, then no cluster at all.
    assert printed_by(output, "aws sagemaker list-training-plans")[-1] == [
        "demo-cluster-plan\tExpired",
        "demo-job-plan\tExpired",
    ]
    assert printed_by(output, "aws sagemaker list-training-jobs")[-1] == ["demo-job\tCompleted"]
    assert printed_by(output, "aws sagemaker describe-cluster")[-1] == [
        "controller-machine\t1\t1\tNotApplicable",
        "worker-group-1\t0\t2\tExpired",
    ]
    assert printed_by(output, "aws sagemaker list-clusters") == [["0"]]
    # Nothing left: no process of this test's, and the demo's directory removed.
    assert marked(os.environ[MARK_VARIABLE]) == []
    assert list(tmp_path.iterdir()) == []
