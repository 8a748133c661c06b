"""Where client commands look for the server, without a server: the error names the address it tried."""

from __future__ import annotations

import pytest

from hyperplan import runtime
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
    monkeypatch.delenv(runtime.DATA_DIR_ENV, raising=False)
    assert client.default_data_dir() == runtime.default_data_dir()
    monkeypatch.setenv(runtime.DATA_DIR_ENV, "~/elsewhere")
    assert client.default_data_dir() == runtime.default_data_dir()
