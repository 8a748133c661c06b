"""The fork server (tests/forkserver.py): a server it forks ends, prints and answers as one started afresh."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.forkserver import ENABLE_VARIABLE, ForkedProcess, start_server_process
from tests.harness import BIN, free_port


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool, *args: str) -> tuple[bool, int, str]:
    """`hyperplan ARGS` as tests.harness.Server starts `serve`: (forked?, exit code, output)."""
    monkeypatch.setenv(ENABLE_VARIABLE, "1" if fork else "0")
    log_path = tmp_path / f"{'forked' if fork else 'fresh'}.log"
    with log_path.open("ab") as log:
        process = start_server_process([str(BIN / "hyperplan"), *args], dict(os.environ), log)
    code = process.wait(timeout=60)
    return isinstance(process, ForkedProcess), code, log_path.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],  # exit 0, on stdout
        ["serve", "--clock", "sundial"],  # a refusal: exit 2, on stdout
        ["serve", "--no-such-option"],  # a usage error: exit 2, on stderr
    ],
    ids=" ".join,
)
def test_a_forked_command_exits_and_prints_as_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    forked, forked_code, forked_output = run(tmp_path, monkeypatch, True, *args)
    fresh, fresh_code, fresh_output = run(tmp_path, monkeypatch, False, *args)
    assert (forked, fresh) == (True, False)
    assert forked_code == fresh_code
    assert forked_output == fresh_output
    assert forked_output.strip()


def test_a_signal_ends_a_forked_server_as_it_ends_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENABLE_VARIABLE, "1")
    args = ["serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--isolation", "none"]
    with (tmp_path / "log").open("ab") as log:
        process = start_server_process([str(BIN / "hyperplan"), *args], dict(os.environ), log)
    assert isinstance(process, ForkedProcess)
    assert process.poll() is None  # it runs until told otherwise (long after this: it is not even up)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL
