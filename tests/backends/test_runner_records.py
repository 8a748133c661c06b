"""A step runner's exit record is the tenant's claim: only well-formed values in range are believed."""

from __future__ import annotations

import pytest

from hyperplan.backends.runner_records import (
    MAX_RECORD_BYTES,
    BadRecord,
    RunnerExit,
    parse_exit_record,
    witnessed,
)


def test_the_runners_own_records_read_as_written() -> None:
    assert parse_exit_record(b'{"exit_code": 3, "signal": null, "ended_at": 1.5}') == RunnerExit(3, None)
    assert parse_exit_record(b'{"exit_code": null, "signal": 15}') == RunnerExit(None, 15)
    assert RunnerExit(None, 15).wait_status_code() == 143 and RunnerExit(7, None).wait_status_code() == 7


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "it is not JSON"),
        (b"{", "it is not JSON"),
        (b"[" * 50_000, "it is not JSON"),  # nested past the parser's depth
        (b"[0]", "it is not a JSON object"),
        (b'{"exit_code": "0"}', 'its exit_code is "0", not an integer from 0 to 255'),
        (b'{"exit_code": true}', "its exit_code is true, not an integer from 0 to 255"),
        (b'{"exit_code": 256}', "its exit_code is 256, not an integer from 0 to 255"),
        (b'{"exit_code": -1}', "its exit_code is -1, not an integer from 0 to 255"),
        (b'{"exit_code": 1.0}', "its exit_code is 1.0, not an integer from 0 to 255"),
        (b'{"signal": 0}', "its signal is 0, not an integer from 1 to 64"),
        (b'{"signal": 99999999999999999999}', "its signal is 99999999999999999999, not an integer"),
        (b'{"signal": "' + b"x" * 100 + b'"}', '"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'),
        (b"{}", "it must give exactly one of exit_code and signal"),
        (b'{"exit_code": 0, "signal": 9}', "it must give exactly one of exit_code and signal"),
        (b" " * (MAX_RECORD_BYTES + 1), f"it is larger than {MAX_RECORD_BYTES} bytes"),
    ],
)
def test_anything_else_is_refused_saying_what_is_wrong(data: bytes, why: str) -> None:
    with pytest.raises(BadRecord) as refused:
        parse_exit_record(data)
    assert why in str(refused.value)


def test_a_status_the_tenant_cannot_write_wins_over_a_record_that_disagrees() -> None:
    """srun's or Slurm's exit status of the runner (its program's code, or 128 + the signal) is the
    truth; the record only tells apart what the status cannot (exit code 143 or SIGTERM)."""
    assert witnessed(RunnerExit(0, None), 3) == RunnerExit(3, None)  # a success forged over a failure
    assert witnessed(RunnerExit(0, None), 137) == RunnerExit(None, 9)  # over a kill
    assert witnessed(None, 143) == RunnerExit(None, 15)  # no record (or a refused one)
    assert witnessed(None, 0) == RunnerExit(0, None)
    assert witnessed(RunnerExit(143, None), 143) == RunnerExit(143, None)  # agrees: the record says which
    assert witnessed(RunnerExit(None, 15), 143) == RunnerExit(None, 15)
    assert witnessed(None, 200) == RunnerExit(200, None)  # above 128 + the last signal: a code
