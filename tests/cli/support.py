"""Running the `hyperplan` command with no server: a clean environment and an address nobody listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def closed_port() -> int:
    """A loopback port that was free a moment ago: connecting to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def client_env(**extra: str) -> dict[str, str]:
    """Keys in the environment and no AWS or hyperplan settings from the machine running the tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_")) and k != "COLUMNS"}
    env.update(
        AWS_ACCESS_KEY_ID="AKIDTESTCLI",
        AWS_SECRET_ACCESS_KEY="secret",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        COLUMNS="100",
    )
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hyperplan"), *args],
        env=env if env is not None else client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
