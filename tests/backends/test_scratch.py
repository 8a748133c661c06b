"""What a deleted account's user leaves on a machine goes, and nothing else: the sweep follows no link,
leaves others' files where they are, and kills every process of the user, forked ones included."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hyperplan.backends import scratch

pytestmark = [
    pytest.mark.isolation,
    pytest.mark.skipif(os.geteuid() != 0, reason="files and processes of other uids: needs root"),
]

LEAVER, NEIGHBOUR = 79901, 79902  # uids no user of this machine has; files may carry any uid


def _own(path: Path, uid: int) -> Path:
    os.chown(path, uid, uid, follow_symlinks=False)
    return path


def test_every_entry_of_the_user_goes_and_nothing_a_link_points_at_or_another_owns(tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    precious = tmp_path / "precious"  # outside the swept root, root's
    precious.write_text("keep me")
    theirs = root / "theirs"
    theirs.mkdir()
    _own(theirs, LEAVER)
    (theirs / "file").write_text("x")
    _own(theirs / "file", LEAVER)
    (theirs / "deep").mkdir()
    _own(theirs / "deep", LEAVER)
    (theirs / "deep" / "file").write_text("x")
    _own(theirs / "deep" / "file", LEAVER)
    (theirs / "link").symlink_to(precious)  # a planted link: removed, never followed
    _own(theirs / "link", LEAVER)
    shared = theirs / "shared"  # the leaver's directory holding a neighbour's file: both stay
    shared.mkdir()
    _own(shared, LEAVER)
    (shared / "neighbours").write_text("not the leaver's")
    _own(shared / "neighbours", NEIGHBOUR)
    servers = root / "servers"  # root's, with a file of the leaver's inside
    servers.mkdir()
    (servers / "left").write_text("x")
    _own(servers / "left", LEAVER)

    swept = scratch.remove_owned(LEAVER, [str(root)])

    assert precious.read_text() == "keep me"
    assert (shared / "neighbours").read_text() == "not the leaver's"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == [
        "servers",
        "theirs",
        "theirs/shared",
        "theirs/shared/neighbours",
    ]
    assert swept.removed == 5  # file, deep/file, link, servers/left, then deep
    assert swept.kept == 2  # theirs/shared and theirs: not empty


def test_a_tree_deeper_than_the_walk_goes_and_a_mount_below_are_passed_over_not_the_end_of_it(
    tmp_path: Path,
) -> None:
    """A tenant's tree as deep as it likes ends no sweep (its levels below MAX_DEPTH stay, counted kept),
    and a file system mounted below the root is never entered; the rest of the root is swept."""
    root = tmp_path / "tmp"
    root.mkdir()
    deep = root
    for _ in range(scratch.MAX_DEPTH + 20):
        deep = deep / "d"
        deep.mkdir()
        _own(deep, LEAVER)
    (deep / "bottom").write_text("x")
    _own(deep / "bottom", LEAVER)
    mounted = root / "mounted"
    mounted.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mounted)], check=True)
    try:
        (mounted / "file").write_text("another file system's")
        _own(mounted / "file", LEAVER)
        (root / "later").write_text("x")  # listed after the deep tree and the mount: still swept
        _own(root / "later", LEAVER)

        swept = scratch.remove_owned(LEAVER, [str(root)])

        assert (mounted / "file").exists()  # not entered
        assert not (root / "later").exists()
        assert (deep / "bottom").exists()  # too deep: left, and so is every directory above it
        assert swept.kept == scratch.MAX_DEPTH and swept.removed == 1, swept  # "later" alone
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_root_is_never_swept_or_killed() -> None:
    with pytest.raises(ValueError, match="root"):
        scratch.remove_owned(0, ["/tmp"])
    with pytest.raises(ValueError, match="root"):
        scratch.kill_processes(0)


def test_every_process_of_the_user_is_killed_even_one_that_left_its_parent() -> None:
    started = subprocess.Popen(
        ["sh", "-c", "(setsid sleep 600 &) ; sleep 600"],
        user=LEAVER,
        group=LEAVER,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    # sh, its sleep, and the sleep it set free; not the subshell that forks the latter and exits at once
    # (counted, it made three processes seen, then two to kill, on a loaded machine)
    while _commands(scratch.owned_by(LEAVER)) != ["sh", "sleep", "sleep"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _commands(scratch.owned_by(LEAVER)) == ["sh", "sleep", "sleep"]
    assert scratch.kill_processes(LEAVER) >= 3
    started.wait(timeout=30)
    deadline = time.monotonic() + 30
    while scratch.owned_by(LEAVER) and time.monotonic() < deadline:
        time.sleep(0.05)  # the freed one is init's to reap
    assert scratch.owned_by(LEAVER) == set()


def test_a_file_system_mounted_below_the_root_is_left_alone(tmp_path: Path) -> None:
    """/tmp may hold another file system (a tenant's bind mount, an operator's tmpfs): not the sweep's."""
    root = tmp_path / "tmp"
    mounted = root / "mounted"
    mounted.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mounted)], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let root mount a tmpfs")
    try:
        theirs = mounted / "theirs"
        theirs.mkdir()
        (theirs / "file").write_text("x")
        (mounted / "empty").mkdir()
        for path in (theirs, theirs / "file", mounted / "empty"):
            _own(path, LEAVER)
        (root / "left").write_text("x")
        _own(root / "left", LEAVER)
        swept = scratch.remove_owned(LEAVER, [str(root)])
        assert (theirs / "file").exists() and (mounted / "empty").is_dir()
        assert not (root / "left").exists()
        assert swept.removed == 1
    finally:
        subprocess.run(["umount", str(mounted)], check=True, capture_output=True)


def _commands(pids: set[int]) -> list[str]:
    """The command names of these processes, sorted; one that has gone since is left out."""
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return sorted(names)
