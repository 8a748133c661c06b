"""What a step runner says about how a program ended, checked before the server believes any of it.

On the Slurm back end the runner (``backends/slurm_runner.py``) runs as the account's OS user and writes
its records in a directory that user owns, so the program it runs can rewrite them: a record is a
tenant's claim, never a fact. This module takes the bytes the server read (already capped in size) and
returns the values, or :class:`BadRecord` saying what is wrong with them. Pure (bytes in, values
out), as core is; it lives here because back ends import no core module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_RECORD_BYTES = 64 * 1024
"""A runner's record is a few dozen bytes; anything larger than this is not one (never read whole)."""

MAX_EXIT_CODE = 255
MAX_SIGNAL = 64  # Linux's SIGRTMAX


class BadRecord(ValueError):
    """A record that is not what the runner writes: the message says what is wrong, for a user."""


@dataclass(frozen=True)
class RunnerExit:
    """How the runner saw its program end: exactly one of the two is set."""

    exit_code: int | None
    signal: int | None

    def wait_status_code(self) -> int:
        """The runner's own exit code for this ending (what Slurm records for a batch script that is the
        runner): the program's code, or 128 + the signal."""
        return self.exit_code if self.exit_code is not None else 128 + (self.signal or 0)


def from_status(code: int) -> RunnerExit:
    """A runner's own exit status (as Slurm or srun reports it) as how its program ended: above 128, the
    signal (as a shell reads it), else the exit code."""
    if 128 < code <= 128 + MAX_SIGNAL:
        return RunnerExit(None, code - 128)
    return RunnerExit(code, None)


def witnessed(claimed: RunnerExit | None, status: int) -> RunnerExit:
    """How a program ended, from the runner's exit ``status`` as a source the tenant cannot write
    reports it, and the runner's record (the tenant's claim, None when missing or refused): the claim
    only where it agrees with the status (it tells an exit code of 143 from SIGTERM), else the status."""
    if claimed is not None and claimed.wait_status_code() == status:
        return claimed
    return from_status(status)


def parse_exit_record(data: bytes) -> RunnerExit:
    """``exit.json``'s ``{"exit_code": int|null, "signal": int|null, ...}``, checked: an object, each
    value an integer in range (a bool is not one), exactly one of them set. Other keys are ignored."""
    if len(data) > MAX_RECORD_BYTES:
        raise BadRecord(f"it is larger than {MAX_RECORD_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise BadRecord("it is not JSON") from None
    if not isinstance(value, dict):
        raise BadRecord("it is not a JSON object")
    code = _small_int(value, "exit_code", 0, MAX_EXIT_CODE)
    signal = _small_int(value, "signal", 1, MAX_SIGNAL)
    if (code is None) == (signal is None):
        raise BadRecord("it must give exactly one of exit_code and signal")
    return RunnerExit(code, signal)


def _small_int(record: dict[str, Any], key: str, low: int, high: int) -> int | None:
    found = record.get(key)
    if found is None:
        return None
    if isinstance(found, bool) or not isinstance(found, int) or not low <= found <= high:
        raise BadRecord(f"its {key} is {_shown(found)}, not an integer from {low} to {high}")
    return found


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
