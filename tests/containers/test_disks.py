"""Disks of a fixed size (hyperplan/backends/disks.py) on this host: real loop devices, real ext4, as root."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import containers, disks
from hyperplan.containers.podman import PodmanStore

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(disks.unusable() is not None, reason=f"no disks here: {disks.unusable()}"),
]

MIB = 2**20


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Path]:
    """A directory (with a space in its name, as mountinfo escapes it) whose disks go afterwards."""
    where = tmp_path / "a tree"
    where.mkdir()
    yield where
    disks.release_under(tmp_path)
    for made in where.glob("*/containers.conf"):  # a store a test prepared: its run state too
        PodmanStore(made.parent).remove()


def test_a_disk_is_a_file_system_of_its_size_that_refuses_more(place: Path) -> None:
    disk = disks.Disk(place / "algo-1", 64 * MIB)
    disks.attach(disk)
    assert disks.is_mounted(disk.mountpoint) and disk.image.is_file()
    assert disk.image.parent == place and disk.image.name == ".algo-1.disk"  # beside it, not in it
    size = os.statvfs(disk.mountpoint)
    assert 48 * MIB < size.f_blocks * size.f_frsize <= 64 * MIB  # (less what ext4 keeps for itself)
    assert os.stat(disk.mountpoint).st_dev != os.stat(place).st_dev
    written = subprocess.run(
        ["dd", "if=/dev/zero", f"of={disk.mountpoint / 'fill'}", "bs=1M", "count=100"],
        capture_output=True,
        text=True,
    )
    assert written.returncode != 0 and "No space left on device" in written.stderr
    assert (disk.mountpoint / "fill").stat().st_size <= 64 * MIB
    assert disk.image.stat().st_blocks * 512 <= 65 * MIB  # the host holds no more than the disk


def test_attaching_again_keeps_what_is_on_it_and_detaching_deletes_it(place: Path) -> None:
    disk = disks.Disk(place / "algo-1", 32 * MIB)
    disks.attach(disk)
    (disk.mountpoint / "checkpoint").write_text("epoch 3")
    disks.attach(disk)  # mounted already: nothing made anew
    assert (disk.mountpoint / "checkpoint").read_text() == "epoch 3"
    subprocess.run(["umount", str(disk.mountpoint)], check=True)  # as a reboot leaves it
    assert not (disk.mountpoint / "checkpoint").exists()
    assert disks.remount(disk.mountpoint) is True  # mounted again from its image, not made anew
    assert (disk.mountpoint / "checkpoint").read_text() == "epoch 3"
    disks.detach(disk.mountpoint)
    assert not disks.is_mounted(disk.mountpoint) and not disk.image.exists()
    assert disks.remount(disk.mountpoint) is False  # nothing left to mount
    disks.detach(disk.mountpoint)  # (and detaching twice is no error)


def test_release_under_detaches_every_disk_below_a_tree_so_it_can_be_removed(place: Path) -> None:
    tops = [place / "attempt-1" / "algo-1", place / "attempt-1" / "algo-2", place / "attempt-2" / "algo-1"]
    for top in tops:
        disks.attach(disks.Disk(top, 16 * MIB))
    busy = subprocess.Popen(["sleep", "600"], cwd=tops[0])  # a process left in one: detached lazily
    try:
        assert disks.release_under(place / "attempt-1") == 2
        assert [top for top in tops if disks.is_mounted(top)] == [tops[2]]
        assert not list((place / "attempt-1").glob(".*.disk"))
    finally:
        busy.kill()
        busy.wait()
    assert disks.release_under(place) == 1


def test_a_disk_below_16_mib_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 MiB"):
        disks.Disk(Path("/nowhere"), MIB)


def test_a_store_given_a_size_keeps_its_layers_on_a_disk_and_its_database_outside_it(place: Path) -> None:
    root = containers.prepare_store(place / "store", size_gb=1)
    store = PodmanStore(root)
    assert disks.is_mounted(store.graph)
    assert f'static_dir = "{root / "libpod"}"' in store.containers_conf.read_text()
    assert containers.prepare_store(root, size_gb=1) == root  # a second start finds it mounted
    # A store that holds images on the host's file system already is not hidden under a new disk.
    used = place / "used"
    (used / "storage" / "overlay").mkdir(parents=True)
    with pytest.raises(disks.DiskError, match="already holds images"):
        containers.prepare_store(used, size_gb=1)
    assert not disks.is_mounted(used / "storage")


def test_a_new_store_gets_a_file_system_of_its_own_by_default_and_one_with_images_keeps_them(
    place: Path,
) -> None:
    free_gib = shutil.disk_usage(place).free // disks.GIB
    fresh = PodmanStore(place / "fresh")
    assert containers.default_store_size(fresh.graph) == max(1, min(200, free_gib // 2))
    assert containers.prepare_store(fresh.root, size_gb=1) == fresh.root and disks.is_mounted(fresh.graph)
    subprocess.run(["umount", str(fresh.graph)], check=True)  # as a reboot leaves it
    assert containers.prepare_store(fresh.root) == fresh.root and disks.is_mounted(fresh.graph)  # its own
    assert shutil.disk_usage(fresh.graph).total <= disks.GIB  # at the size it was made with
    used = PodmanStore(place / "used")
    (used.graph / "overlay").mkdir(parents=True)
    assert containers.default_store_size(used.graph) == 0  # left as it was: its images stay reachable
    containers.prepare_store(used.root)
    assert not disks.is_mounted(used.graph) and (used.graph / "overlay").is_dir()
    assert containers.prepare_store(place / "plain", size_gb=0) and not disks.is_mounted(
        place / "plain" / "storage"
    )
