"""Reading files a tenant's process may have replaced (hyperplan/backends/tenant_files.py, and the timed
log's reader): a link to a secret, a hard link, a FIFO, a giant file are refused or cut, never followed,
waited on or read whole. Real files and FIFOs; each read must return at once (a FIFO with no writer
would block an ordinary open forever: the test itself would hang)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyperplan.backends import tenant_files, timedlog
from hyperplan.backends.tenant_files import Refused

SECRET = b"admin secret\n"


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "out").mkdir()
    return tmp_path


def _traps(place: Path) -> dict[str, Path]:
    out = place / "out"
    (out / "link").symlink_to(place / "secret")
    os.link(place / "secret", out / "hard")
    os.mkfifo(out / "fifo")
    (out / "dir").mkdir()
    return {
        "is a symbolic link": out / "link",
        "has 2 names (a hard link)": out / "hard",
        "is a FIFO, not a regular file": out / "fifo",
        "is a directory, not a regular file": out / "dir",
    }


def test_links_fifos_and_directories_are_refused_by_name_and_never_read(place: Path) -> None:
    for why, path in _traps(place).items():
        with pytest.raises(Refused) as refused:
            tenant_files.read_capped(path, 100)
        assert str(refused.value) == f"{path.name} {why}"
        assert tenant_files.read_at(path, 0, 100) == b""
        assert tenant_files.tail(path) == f"[not read: {path.name} {why}]"
        assert tenant_files.exists(path)
    missing = place / "out" / "missing"
    assert tenant_files.read_capped(missing, 100) is None and tenant_files.read_at(missing, 0, 9) == b""
    assert tenant_files.tail(missing) == "" and not tenant_files.exists(missing)


def test_a_giant_file_is_refused_having_read_one_byte_past_the_cap(place: Path) -> None:
    big = place / "out" / "big"
    with big.open("wb") as out:
        out.truncate(10 << 30)  # 10 GiB, sparse: a whole read would not end
    with pytest.raises(Refused, match="big is larger than 1000 bytes"):
        tenant_files.read_capped(big, 1000)
    assert len(tenant_files.read_at(big, 5 << 30, 10)) == 10
    assert tenant_files.tail(big, 20) == "\0" * 20
    (place / "out" / "small").write_bytes(b"ok")
    assert tenant_files.read_capped(place / "out" / "small", 2) == b"ok"


def test_the_timed_log_reader_reads_nothing_but_a_regular_file_and_bounds_each_read(place: Path) -> None:
    for path in _traps(place).values():
        assert timedlog.read_records(path) == ([], 0)
    # A log of junk: one read goes through at most its budget, and the cursor moves past what it skipped.
    junk = place / "out" / "timed.log"
    good = timedlog.record(1_000_000, b"o", b"last")
    empty_lines = timedlog.READ_BUDGET // timedlog.LINE_COST + 10
    junk.write_bytes(b"\n" * empty_lines + b"x" * (3 * timedlog.MAX_LINE) + b"\n" + good)
    records, cursor = timedlog.read_records(junk)
    assert records == [] and cursor == timedlog.READ_BUDGET // timedlog.LINE_COST
    while not records:
        records, cursor = timedlog.read_records(junk, cursor)
    assert records == [(1_000_000, "o", b"last")] and cursor == junk.stat().st_size
