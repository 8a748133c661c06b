"""`hyperplan plans lending` as a user runs it, against an in-process server: it shows a plan's lending,
lends (--idle, with the fleet's defaults or given seconds) and stops (--none); what is wrong is one line,
exit code 2 before any request and 1 for the server's refusal."""

from __future__ import annotations

import json

from hyperplan.signing import Credentials
from tests.harness import ADMIN
from tests.inprocess import InProcessServer


def _buy(server: InProcessServer, credentials: Credentials, name: str) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    created = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return str(created["TrainingPlanArn"])


def _one_line(process: object, code: int) -> str:
    said = f"{process.stdout}{process.stderr}"  # type: ignore[attr-defined]
    assert process.returncode == code, said  # type: ignore[attr-defined]
    assert "Traceback" not in said and len(said.strip().splitlines()) == 1, said
    return said.strip()


def test_the_command_shows_sets_and_stops_lending(fast_server: InProcessServer) -> None:
    team = fast_server.new_account("cli-lender")
    arn = _buy(fast_server, team, "shared")

    def lending(*args: str, credentials: Credentials = team) -> str:
        return fast_server.cli("plans", "lending", *args, credentials=credentials).stdout

    shown = lending("shared")
    assert "shared  lending: none (the plan lends nothing)" in shown and "Credited" in shown
    shown = lending("shared", "--idle")
    assert "lending: idle, notice 120 s, minimum run 300 s, stop-lending margin 900 s" in shown
    lending("shared", "--idle", "--notice", "30", "--margin", "600")
    answer = json.loads(lending("shared", "--json"))
    assert (
        answer["Mode"],
        answer["NoticeSeconds"],
        answer["MinRunSeconds"],
        answer["StopMarginSeconds"],
    ) == (
        "idle",
        30,
        300,
        600,
    )
    assert "Runs" not in answer and "Runs (newest first)" not in lending("shared")
    # An administrator names the plan by its ARN, and sees the (here empty) table of runs.
    assert "Runs (newest first)" in lending(arn, credentials=ADMIN)

    assert "lending: none (the plan lends nothing)" in lending("shared", "--none")
    assert json.loads(lending("shared", "--json"))["Mode"] == "none"


def test_what_is_wrong_is_one_line(fast_server: InProcessServer) -> None:
    team = fast_server.new_account("cli-wrong")
    _buy(fast_server, team, "mine")

    def lending(*args: str) -> object:
        return fast_server.cli("plans", "lending", *args, credentials=team, check=False)

    said = _one_line(lending("mine", "--notice", "60"), 2)
    assert "--notice, --min-run and --margin go with --idle" in said
    assert "give --idle or --none, not both" in _one_line(lending("mine", "--idle", "--none"), 2)
    said = _one_line(lending("mine", "--idle", "--notice", "601"), 1)
    assert said == "ValidationException: Notice (601) is longer than the fleet's longest notice, 600 seconds."
    said = _one_line(lending("theirs"), 1)
    assert said == "ResourceNotFound: Training plan theirs does not exist."
    assert json.loads(fast_server.cli("plans", "lending", "mine", "--json", credentials=team).stdout)[
        "Mode"
    ] == ("none")
