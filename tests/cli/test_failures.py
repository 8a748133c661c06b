"""What the `hyperplan` command says when something is wrong, run as a user runs it: one line naming what is
wrong and never a traceback (exit code 2 for a mistake found before any request, 1 for the server's
refusal or absence); times in one syntax, a relative one counted from the service clock; messages printed
as they are, brackets included; and `--help` listing the commands in the order of the work."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from hyperplan.cli.common import failure_line
from hyperplan.cli.views.base import TableView
from hyperplan.cli.views.clusters import NodesTable
from hyperplan.cli.views.plans import PlanHistory
from tests.cli.support import client_env, closed_port, run_cli
from tests.harness import service_now
from tests.inprocess import InProcessServer

SEARCH = ["plans", "search", "--instance-type", "ml.p5.48xlarge", "--count", "1", "--target", "training-job"]
FORMS = "give a date (2026-12-07, midnight UTC), a date and time (2026-12-07T10:00 or '2026-12-07 10:00'"
POSTGRES_HINT = "a PostgreSQL store needs psycopg 3: pip install 'hyperplan[postgres]'"


def said(process: object) -> str:
    return f"{process.stdout}{process.stderr}"  # type: ignore[attr-defined]


def no_traceback(process: object, code: int) -> str:
    """The process ended with `code` and no traceback; what it said."""
    output = said(process)
    assert process.returncode == code, output  # type: ignore[attr-defined]
    assert "Traceback" not in output and 'File "' not in output
    return output


def test_help_lists_the_commands_in_the_order_of_the_work() -> None:
    process = run_cli("--help")
    assert process.returncode == 0
    titles = re.findall(r"^(\S[^:\n]*):$", process.stdout, re.MULTILINE)
    assert titles == ["Options", "The work", "Administration", "Serving"]
    listed = re.findall(r"^  ([a-z]+) ", process.stdout.split("\nThe work:\n", 1)[1], re.MULTILINE)
    assert listed == [
        *["plans", "clusters", "jobs", "fleet"],
        *["accounts", "users", "keys", "buckets", "registries", "invoices", "webhooks", "usage", "audit"],
        *["admin"],
        *["serve", "clock", "simulate", "backup", "restore"],
    ]


# -- mistakes found before any request: exit code 2, one line, no server asked ------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            [*SEARCH, "--days", "1", "--start-after", "tomorrow"],
            f"--start-after: 'tomorrow' is not a time; {FORMS}",
        ),
        ([*SEARCH, "--days", "1", "--end-before", "2026-02-30"], "'2026-02-30' is not a real date and time"),
        (
            ["clock", "set", "2026-13-01T10:00"],
            "Invalid value for TIME: '2026-13-01T10:00' is not a real date",
        ),
        (["audit", "list", "--since", "last week"], f"--since: 'last week' is not a time; {FORMS}"),
        (["usage", "--from", "+3x"], f"--from: '+3x' is not a time; {FORMS}"),
        (
            ["clock", "show", "--endpoint-url", "http://[::1"],
            "--endpoint-url 'http://[::1' is not a server's URL",
        ),
        (
            [*SEARCH, "--instance-count", "2"],
            "Error: No such option: --instance-count (Possible options: --count, --instance-type) "
            "(see `hyperplan plans search --help`)",
        ),
        (["--bogus", "plans", "list"], "Error: No such option: --bogus (see `hyperplan --help`)"),
    ],
    ids=[
        *["a word", "no such day", "clock set", "audit --since", "usage --from", "bad IPv6"],
        *["no such option", "no such root option"],
    ],
)
def test_a_mistake_in_a_client_command_is_one_line_before_any_request(args: list[str], expected: str) -> None:
    # The endpoint is a port nobody listens on: a request would end in "Cannot reach the server" (exit 1).
    env = client_env(HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}")
    output = no_traceback(run_cli(*args, env=env), 2)
    assert expected in output and "Cannot reach" not in output
    assert len(output.strip().splitlines()) == 1, output  # not Click's usage block


def test_an_endpoint_from_the_environment_is_named_as_such() -> None:
    env = client_env(HYPERPLAN_ENDPOINT_URL="127.0.0.1:8080")
    output = no_traceback(run_cli("clock", "show", env=env), 2)
    assert "ValidationException: $HYPERPLAN_ENDPOINT_URL '127.0.0.1:8080' is not a server's URL" in output


def test_a_relative_time_asks_the_server_for_its_clock() -> None:
    # `+3d` counts from the service clock: with no server, the command stops there, saying where it looked.
    port = closed_port()
    env = client_env(HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    output = no_traceback(run_cli(*SEARCH, "--days", "1", "--start-after", "+3d", env=env), 1)
    assert f"Cannot reach the server at http://127.0.0.1:{port}: " in output


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("files")
    (directory / "latin1.toml").write_bytes(b"region = 'caf\xe9'\n")
    (directory / "a-file").write_text("not a directory\n")
    return directory


def test_files_that_cannot_be_read_are_named_not_traced(files: Path) -> None:
    workload = files / "a-file"  # never read: the fleet file is refused first
    undecodable = no_traceback(
        run_cli("simulate", "--fleet", str(files / "latin1.toml"), "--workload", str(workload)), 2
    )
    assert f"Invalid value for --fleet: {files / 'latin1.toml'} is not UTF-8 text (byte 13)" in undecodable
    missing = no_traceback(
        run_cli("simulate", "--fleet", str(files / "none.toml"), "--workload", str(workload)), 2
    )
    assert "--fleet" in missing and "does not exist" in missing
    relative = no_traceback(
        run_cli("simulate", "--fleet", str(workload), "--workload", str(workload), "--start", "+1d"), 2
    )
    assert (
        "ValidationException: --start: '+1d' is counted from now, and there is no service clock" in relative
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--fleet", "{files}/none.toml"],
            "Invalid value for --fleet: cannot read {files}/none.toml: No such file",
        ),
        (
            ["--data-dir", "{files}/a-file"],
            "ValidationException: the data directory {files}/a-file is a file",
        ),
        (["--clock-start", "soon"], f"ValidationException: --clock-start: 'soon' is not a time; {FORMS}"),
    ],
    ids=["missing fleet file", "data directory a file", "clock-start"],
)
def test_serve_refuses_what_it_cannot_use_before_it_starts(
    files: Path, tmp_path: Path, extra: list[str], expected: str
) -> None:
    # Each is refused before anything is opened: were it not, this would start a server (on a port of
    # its own, with nothing to run), and the run would time out rather than pass.
    base = [
        "--data-dir",
        str(tmp_path / "data"),
        "--work-dir",
        str(tmp_path / "work"),
        "--port",
        str(closed_port()),
    ]
    base += ["--clock", "manual", "--isolation", "none", "--runtime", "process"]
    process = run_cli("serve", *base, *[arg.format(files=files) for arg in extra])
    assert expected.format(files=files) in " ".join(no_traceback(process, 2).split())
    assert not (tmp_path / "data").exists()


def test_the_postgres_hint_keeps_its_brackets(tmp_path: Path) -> None:
    # Where psycopg is not installed (here: a package of that name that fails to import, first on the
    # path), a PostgreSQL store is refused with the hint, extra's brackets and all.
    (tmp_path / "hide" / "psycopg").mkdir(parents=True)
    (tmp_path / "hide" / "psycopg" / "__init__.py").write_text("raise ImportError('not installed here')\n")
    env = client_env(PYTHONPATH=str(tmp_path / "hide"))
    args = [
        "--data-dir",
        str(tmp_path / "data"),
        "--work-dir",
        str(tmp_path / "work"),
        "--port",
        str(closed_port()),
    ]
    args += [
        "--isolation",
        "none",
        "--runtime",
        "process",
        "--database-url",
        "postgresql://hp@127.0.0.1:9/hp",
    ]
    output = no_traceback(run_cli("serve", *args, env=env), 2)
    assert f"ValidationException: {POSTGRES_HINT}\n" in output


# -- against a server: times counted from its clock, refusals in one line, messages as they are -----


def test_the_issues_search_runs_and_a_refusal_is_one_line(fast_shared_server: InProcessServer) -> None:
    # `plans search --start-after 2025-01-01` printed a traceback: a date is midnight UTC, and a start
    # long past leaves the soonest start as it was. A window that ends long past is the server's refusal:
    # one line on stderr, exit code 1.
    searched = fast_shared_server.cli(*SEARCH, "--days", "1", "--start-after", "2025-01-01", "--json")
    assert json.loads(searched.stdout)
    process = fast_shared_server.cli(*SEARCH, "--days", "1", "--end-before", "2025-01-01", check=False)
    no_traceback(process, 1)
    assert process.stdout == "" and process.stderr.startswith("ValidationException: ")
    assert len(process.stderr.strip().splitlines()) == 1


def test_relative_times_count_from_the_service_clock(fast_shared_server: InProcessServer) -> None:
    # The manual clock is not the machine's: `+3d` is three days after the service's now.
    now = service_now(fast_shared_server)
    found = fast_shared_server.cli(
        *SEARCH, "--days", "1", "--start-after", "+3d", "--end-before", "+10d", "--json"
    )
    offerings = json.loads(found.stdout)
    assert offerings
    for offering in offerings:
        for segment in offering["ReservedCapacityOfferings"]:
            start, end = (datetime.fromisoformat(segment[key]) for key in ("StartTime", "EndTime"))
            assert now + timedelta(days=3) <= start and end <= now + timedelta(days=10)
    dated = fast_shared_server.cli(
        *SEARCH, "--days", "1", "--start-after", _minute(now + timedelta(days=3)), "--json"
    )
    assert (
        json.loads(dated.stdout)[0]["ReservedCapacityOfferings"] == offerings[0]["ReservedCapacityOfferings"]
    )


def test_clock_set_takes_the_same_times(fast_shared_server: InProcessServer) -> None:
    before = service_now(fast_shared_server)
    fast_shared_server.cli("clock", "set", "+1d")
    assert service_now(fast_shared_server) == before + timedelta(days=1)
    day = (before + timedelta(days=3)).date()
    fast_shared_server.cli("clock", "set", day.isoformat())
    assert service_now(fast_shared_server) == datetime(day.year, day.month, day.day, tzinfo=UTC)
    fast_shared_server.cli("clock", "set", f"{day.isoformat()} 10:00 +02:00")
    assert service_now(fast_shared_server) == datetime(day.year, day.month, day.day, 8, tzinfo=UTC)


def test_a_servers_message_keeps_its_brackets(fast_shared_server: InProcessServer) -> None:
    # The name is refused by the API's pattern, whose message quotes both: each printed as it came.
    process = fast_shared_server.cli("plans", "show", "hp-n[01-04]", check=False)
    output = no_traceback(process, 1)
    assert "'hp-n[01-04]'" in output and "[a-zA-Z0-9]" in output


def test_a_name_with_a_space_or_an_accent_is_the_servers_to_refuse(
    fast_shared_server: InProcessServer,
) -> None:
    # Sent encoded in the path, as any name: not a traceback, nor "Cannot reach the server".
    process = fast_shared_server.cli("accounts", "ledger", "équipe vision", check=False)
    assert no_traceback(process, 1).strip() == "ResourceNotFound: No account 'équipe vision'."


def test_a_table_cell_keeps_its_brackets(fast_shared_server: InProcessServer) -> None:
    user = "ci[bot]@hp-n[01-04]"  # a registry login may hold brackets: the table shows it as it is
    fast_shared_server.cli(
        "registries",
        "set-credentials",
        "registry.example:5000",
        "--username",
        user,
        "--password-stdin",
        stdin="pw",
    )
    listed = fast_shared_server.cli("registries", "list").stdout
    assert user in listed


# -- rendering, in-process ------------------------------------------------------------------------


def rendered(renderable: object) -> str:
    out = StringIO()
    Console(file=out, width=200, emoji=False).print(renderable)
    return out.getvalue()


def test_views_and_failure_lines_print_brackets_as_they_are() -> None:
    assert (
        rendered(failure_line("ValidationException", POSTGRES_HINT))
        == f"ValidationException: {POSTGRES_HINT}\n"
    )
    node = {
        "InstanceGroupName": "[workers]",
        "InstanceId": "i-1",
        "PrivateDnsHostname": "hp-n01",
        "InstanceType": "ml.p5.48xlarge",
        "InstanceStatus": {"Status": "Failure", "Message": "Slurm: hp-n[01-04] down [bold]not-bold[/bold]"},
        "LaunchTime": datetime(2026, 12, 1, tzinfo=UTC),
    }
    shown = rendered(NodesTable("c[1]", [node]))
    assert "Nodes of c[1]" in shown and "[workers]" in shown
    assert "Slurm: hp-n[01-04] down [bold]not-bold[/bold]" in shown
    history = {
        "TrainingPlanName": "p",
        "Events": [{"At": "t", "Kind": "k", "Status": "s", "Message": POSTGRES_HINT}],
    }
    assert POSTGRES_HINT in rendered(PlanHistory(history))
    assert "[red]x[/red]" in rendered(TableView("[red]x[/red]", ["[b]"], [["[i]y[/i]"]]))


def _minute(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")  # as the CLI's tables print a time
