"""`hyperplan --help` and client commands import only what they need: never the server's stack."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hyperplan.cli.main import COMMANDS, GROUPS
from tests.cli.support import client_env, closed_port

SERVER_STACK = (
    "sqlalchemy",
    "alembic",
    "numpy",
    "starlette",
    "uvicorn",
    "hyperplan.app",
)
CLIENT_STACK = ("botocore", "httpx", "http.client")

# Runs the command as the console script does, then reports which modules it imported.
PROBE = """
import sys
from hyperplan.cli.main import app
try:
    app(sys.argv[1:], prog_name="hyperplan")
except SystemExit:
    pass
sys.stderr.write("\\nIMPORTED " + " ".join(sorted(sys.modules)) + "\\n")
"""


def imported_by(*args: str) -> set[str]:
    process = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=client_env(), capture_output=True, text=True, timeout=60
    )
    line = process.stderr.rsplit("\nIMPORTED ", 1)[-1]
    return set(line.split())


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules} | modules


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["plans", "--help"], ["plans", "list", "--help"], ["serve", "--help"]],
    ids=" ".join,
)
def test_help_and_version_import_neither_the_server_nor_the_client_stack(args: list[str]) -> None:
    modules = top_level(imported_by(*args))
    assert "typer" in modules  # the probe ran the command
    assert not modules & set(SERVER_STACK + CLIENT_STACK)
    assert "rich.markdown" not in modules  # help in Click's plain layout (hyperplan.cli.options.PLAIN_HELP)


@pytest.mark.parametrize("args", [["clock", "show"], ["plans", "list"]], ids=" ".join)
def test_a_client_command_never_imports_the_server_stack(args: list[str]) -> None:
    modules = top_level(imported_by(*args, "--endpoint-url", f"http://127.0.0.1:{closed_port()}"))
    assert "http.client" in modules  # it did try to reach the server
    assert not modules & set(SERVER_STACK)
    assert "pydantic" not in modules  # Typer 0.29 builds every parameter through it (pyproject.toml)


@pytest.mark.parametrize("args", [["clock", "show"], ["plans", "list"]], ids=["native", "SageMaker API"])
def test_a_client_command_needs_neither_botocore_nor_httpx(args: list[str]) -> None:
    # The shared credentials file is read with the standard library's INI parser, as botocore reads it:
    # botocore's session costs half a second, and its client loads SageMaker's whole model
    # (hyperplan.cli.sagemaker).
    modules = top_level(imported_by(*args, "--endpoint-url", f"http://127.0.0.1:{closed_port()}"))
    assert "http.client" in modules
    # ... and talks to the server with the standard library: importing httpx takes as long as Typer.
    assert not modules & {"botocore", "httpx"}
    # The server's own start-up needs (logging, secrets, signals) are imported by `serve` alone.
    assert not modules & {"logging", "secrets", "rich._emoji_codes"}
    # Of the command groups, only the one named is imported and built (hyperplan/cli/lazy.py).
    group = f"hyperplan.cli.{args[0]}"
    assert group in modules
    others = {later.module for later in [*GROUPS.values(), *COMMANDS.values()]} - {group}
    assert len(others) > 10 and not modules & others


def test_the_server_imports_no_s3_client_unless_a_bucket_lives_on_an_s3_endpoint() -> None:
    # What `serve` imports to answer its first request. boto3 (with s3transfer) is a tenth of a server's
    # start-up and serves only buckets a fleet file maps to an S3 endpoint (hyperplan.objects.storage).
    probe = (
        "import sys, hyperplan.cli.main, hyperplan.app, hyperplan.server.app, hyperplan.server.serving\n"
        "print(' '.join(sys.modules))"
    )
    process = subprocess.run(
        [sys.executable, "-c", probe], env=client_env(), capture_output=True, text=True, timeout=60
    )
    modules = top_level(set(process.stdout.split()))
    assert "hyperplan.server.app" in modules  # the probe imported the server
    assert not modules & {"boto3", "s3transfer"}
