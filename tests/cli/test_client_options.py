"""Where client commands look for the server, without a server: the error names the address it tried."""

from __future__ import annotations

import pytest

from hyperplan import app
from hyperplan.cli import client
from tests.cli.support import client_env, closed_port, run_cli


def unreachable(command: list[str], *extra: str, **env: str) -> str:
    process = run_cli(*command, *extra, env=client_env(**env))
    assert process.returncode == 1, process.stderr
    assert "Cannot reach the server at " in process.stderr
    return process.stderr


COMMANDS = [["clock", "show"], ["plans", "list"]]  # the native API and the SageMaker API


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_the_flag_beats_every_variable(command: list[str]) -> None:
    flag, ours, aws = closed_port(), closed_port(), closed_port()
    err = unreachable(
        command,
        "--endpoint-url",
        f"http://127.0.0.1:{flag}",
        HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{ours}",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{aws}",
    )
    assert f"at http://127.0.0.1:{flag}:" in err


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_hyperplan_endpoint_url_beats_aws_endpoint_url(command: list[str]) -> None:
    ours, aws = closed_port(), closed_port()
    err = unreachable(
        command, HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{ours}", AWS_ENDPOINT_URL=f"http://127.0.0.1:{aws}"
    )
    assert f"at http://127.0.0.1:{ours}:" in err


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_aws_endpoint_url_is_honoured(command: list[str]) -> None:
    aws = closed_port()
    assert f"at http://127.0.0.1:{aws}:" in unreachable(command, AWS_ENDPOINT_URL=f"http://127.0.0.1:{aws}")


def test_without_flag_or_variable_the_default_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process: something on this machine may listen on the default port, so no command is run.
    monkeypatch.delenv(client.ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(client.AWS_ENDPOINT_ENV, raising=False)
    assert client.resolve_endpoint(None) == "http://127.0.0.1:8080"
    monkeypatch.setenv(client.AWS_ENDPOINT_ENV, "http://aws.example:1/")
    assert client.resolve_endpoint(None) == "http://aws.example:1"


def test_the_client_finds_the_same_data_directory_as_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(client.DATA_DIR_ENV, raising=False)
    assert client.default_data_dir() == app.default_data_dir()
    monkeypatch.setenv(client.DATA_DIR_ENV, "~/elsewhere")
    assert client.default_data_dir() == app.default_data_dir()


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_client_options_go_before_the_command_too(command: list[str]) -> None:
    before = closed_port()
    process = run_cli("--endpoint-url", f"http://127.0.0.1:{before}", *command)
    assert f"at http://127.0.0.1:{before}:" in process.stderr


def test_given_before_and_after_the_command_the_later_wins() -> None:
    before, after = closed_port(), closed_port()
    process = run_cli(
        "--endpoint-url",
        f"http://127.0.0.1:{before}",
        "plans",
        "list",
        "--endpoint-url",
        f"http://127.0.0.1:{after}",
    )
    assert f"at http://127.0.0.1:{after}:" in process.stderr


def test_the_profile_flag_before_the_command_is_used() -> None:
    # Keys in the environment, but a named profile that does not exist and a data directory without a
    # credentials file: the command stops before any request, naming the profile.
    env = client_env()
    process = run_cli("--profile", "nowhere", "--data-dir", "/nonexistent", "clock", "show", env=env)
    assert process.returncode == 2
    assert "No credentials (profile 'nowhere')" in process.stderr


def test_version() -> None:
    from importlib.metadata import version

    process = run_cli("--version")
    assert process.returncode == 0
    assert process.stdout == f"hyperplan {version('hyperplan')}\n"


def test_serve_refuses_client_options_before_it() -> None:
    # serve has its own --data-dir; taking the client's would silently start on another directory.
    process = run_cli("--data-dir", "/nonexistent", "serve")
    assert process.returncode == 2
    assert "client options go with client commands" in process.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_text_command_refuses_json_wherever_it_is_given(where: str) -> None:
    args = ["--json", "jobs", "logs", "x"] if where == "before" else ["jobs", "logs", "x", "--json"]
    process = run_cli(*args)
    assert process.returncode == 2
    assert "--json" in process.stderr
