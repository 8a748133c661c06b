"""The timed-log wrapper (hyperplan/backends/timedlog.py) on its own, as a Slurm job step would run it:
real processes, a plain script file and ``python3 -m``; the records it writes and how it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hyperplan.backends import timedlog

SCRIPT = Path(timedlog.__file__)


def _records(path: Path) -> list[tuple[int, str, bytes]]:
    records, cursor = timedlog.read_records(path)
    assert cursor == path.stat().st_size  # every record whole, none left over
    return records


def test_each_line_is_recorded_with_the_time_it_was_written_and_the_output_passes_unchanged(
    tmp_path: Path,
) -> None:
    log, out, err = tmp_path / "timed.log", tmp_path / "out", tmp_path / "err"
    program = "echo one; sleep 0.3; echo two >&2; printf 'no newline'"
    files = ["--log", str(log), "--stdout", str(out), "--stderr", str(err)]
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), *files, "--", "sh", "-c", program], timeout=30
    )
    assert done.returncode == 0
    records = _records(log)
    assert [(stream, text) for _, stream, text in records] == [
        ("o", b"one"),
        ("e", b"two"),
        ("o", b"no newline"),
    ]
    # Times per line, not per file: the second line came 0.3 s after the first.
    assert records[1][0] - records[0][0] >= 250_000
    assert (out.read_bytes(), err.read_bytes()) == (b"one\nno newline", b"two\n")
    # Read in pieces, the cursor moves record by record.
    first, cursor = timedlog.read_records(log, 0, limit=1)
    rest, end = timedlog.read_records(log, cursor)
    assert first + rest == records and end == log.stat().st_size


def test_it_ends_as_its_program_ended(tmp_path: Path) -> None:
    log = tmp_path / "timed.log"
    module = [sys.executable, "-m", "hyperplan.backends.timedlog", "--log", str(log), "--"]
    assert subprocess.run([*module, "sh", "-c", "exit 3"], timeout=30).returncode == 3
    assert subprocess.run([*module, "sh", "-c", "kill -9 $$"], timeout=30).returncode == -signal.SIGKILL
    missing = subprocess.run([*module, "no-such-program-here"], timeout=30, capture_output=True)
    assert missing.returncode == 127 and b"cannot start 'no-such-program-here'" in missing.stderr


def test_the_program_gets_the_environment_on_env_fd_and_the_wrapper_keeps_its_own(tmp_path: Path) -> None:
    """What comes on --env-fd is the program's whole environment (its PATH finds the program); the
    wrapper runs in the one it was started with, so a tenant's LD_PRELOAD never reaches its execve."""
    log = tmp_path / "timed.log"
    given = {"PATH": "/usr/bin:/bin", "ONLY_THE_PROGRAMS": "yes", "LD_PRELOAD": "/no/such/library.so"}
    read_end, write_end = os.pipe()
    os.write(write_end, json.dumps(given).encode())
    os.close(write_end)
    wrapper = [sys.executable, "-I", "-S", str(SCRIPT), "--log", str(log), "--env-fd", str(read_end)]
    wrapper_env = {"PATH": "/usr/bin:/bin", "WRAPPERS_OWN": "yes"}
    printed = subprocess.run(
        [*wrapper, "--", "sh", "-c", "env; cat /proc/$PPID/environ | tr '\\0' '\\n' | sed s/^/wrapper:/"],
        env=wrapper_env,
        pass_fds=(read_end,),
        capture_output=True,
        text=True,
        timeout=30,
    )
    os.close(read_end)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    program = {line for line in lines if not line.startswith("wrapper:")}
    assert {"ONLY_THE_PROGRAMS=yes", "LD_PRELOAD=/no/such/library.so"} <= program
    assert "WRAPPERS_OWN=yes" not in program
    wrapper_seen = {line.removeprefix("wrapper:") for line in lines if line.startswith("wrapper:")}
    assert "WRAPPERS_OWN=yes" in wrapper_seen
    assert not any(line.startswith(("LD_PRELOAD", "ONLY_THE_PROGRAMS")) for line in wrapper_seen)


def test_an_environment_that_is_not_an_object_of_strings_is_refused(tmp_path: Path) -> None:
    for text in ("[1, 2]", '{"A": 1}', '{"A=B": "c"}', "not json"):
        read_end, write_end = os.pipe()
        os.write(write_end, text.encode())
        os.close(write_end)
        refused = subprocess.run(
            [
                sys.executable,
                str(SCRIPT),
                "--log",
                str(tmp_path / "log"),
                "--env-fd",
                str(read_end),
                "--",
                "true",
            ],
            pass_fds=(read_end,),
            capture_output=True,
            text=True,
            timeout=30,
        )
        os.close(read_end)
        assert refused.returncode == 2 and f"--env-fd {read_end}" in refused.stderr, (text, refused.stderr)


def test_a_signal_to_the_group_reaches_the_program_once_and_its_last_lines_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "timed.log"
    program = "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    wrapper = subprocess.Popen(
        [sys.executable, "-I", "-S", str(SCRIPT), "--log", str(log), "--", "sh", "-c", program],
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own, as a back end starts a task
    )
    try:
        until = time.monotonic() + 20
        while b"ready" not in (log.read_bytes() if log.exists() else b"") and time.monotonic() < until:
            time.sleep(0.02)
        os.killpg(wrapper.pid, signal.SIGTERM)
        assert wrapper.wait(timeout=20) == 0
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()
    texts = [text for _, _, text in _records(log)]
    # Once, though both got the signal; (sh may also say its sleep was Terminated, as without us).
    assert texts[0] == b"ready" and texts.count(b"got TERM") == 1, texts


def test_a_long_line_is_cut_into_records_and_its_newline_makes_no_empty_one() -> None:
    cutter = timedlog.LineCutter(b"o")
    records = cutter.feed(b"x" * timedlog.MAX_LINE, 1_000_000) + cutter.feed(b"\nnext\n", 2_000_000)
    assert [len(r) for r in records] == [len(b"1.000000 o \n") + timedlog.MAX_LINE, len(b"2.000000 o next\n")]
    assert cutter.flush() == []


def test_a_read_bounded_in_bytes_stops_at_the_record_that_reaches_the_bound(tmp_path: Path) -> None:
    """What a log reader holds at once (services/jobs/log_reading.py): ``max_bytes`` of text and one record
    at most, and the cursor goes on exactly after the last record returned."""
    log = tmp_path / "timed.log"
    texts = [b"a" * 40, b"b" * 40, b"c" * 40, b"d" * 10]
    log.write_bytes(b"".join(timedlog.record(1_000_000 + n, b"o", text) for n, text in enumerate(texts)))
    first, cursor = timedlog.read_records(log, 0, max_bytes=50)
    assert [text for _, _, text in first] == texts[:2]  # 80 bytes: the second reached the bound
    second, cursor = timedlog.read_records(log, cursor, max_bytes=40)
    assert [text for _, _, text in second] == texts[2:3]  # exactly the bound
    rest, end = timedlog.read_records(log, cursor, max_bytes=1)
    assert [text for _, _, text in rest] == texts[3:] and end == log.stat().st_size
    assert timedlog.read_records(log, 0, max_bytes=0)[0] == []
    assert [text for _, _, text in timedlog.read_records(log, 0)[0]] == texts  # no bound: all of them
