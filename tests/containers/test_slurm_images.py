"""Images unpacked for the Slurm back end's nodes (hyperplan/backends/slurm_images.py): the session's Python
image pulled from the dev registry into a fresh Podman store and unpacked once, root's and read-only to
every other user; a reference the registry lacks recorded as a problem, nothing half-made left; a
registry that asks for a login; and what makes an unpacked file system safe to share, on a crafted one.

Each test has a store and an IMAGES directory of its own (fast: the registry is on this host), removed
after; the registry and the images are the session's (tests/image_fixtures.py).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends import slurm_images
from hyperplan.backends.base import Login
from hyperplan.backends.containers import Podman
from hyperplan.backends.slurm_images import (
    MOUNT_DIRS,
    MOUNT_FILES,
    ImageNotReady,
    SlurmImages,
    image_key,
    make_mount_points,
    make_safe,
)
from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, podman, script

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: unpacks images as root, as the server does"),
]

UNPACK_TIMEOUT = 300.0
USERNAME = "node-puller"
PASSWORD = "slurm-images-3f9b21c7"
CAP_SETUID = 7


@dataclass(frozen=True)
class Place:
    """A fresh Podman store and the IMAGES directory of a back end root every user may pass through."""

    store: PodmanStore
    podman: Podman
    images_dir: Path

    def images(self) -> SlurmImages:
        """What one server process has: a new one is a server that restarted, or another on the work root."""
        return SlurmImages(self.images_dir, self.podman)


@pytest.fixture
def place(container_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    store = PodmanStore(tmp_path_factory.mktemp("slurm-images-store"))
    store.prepare()
    root = Path(tempfile.mkdtemp(prefix="hp-slurm-images-"))  # pytest's own directories are 0700
    root.chmod(0o711)
    try:
        yield Place(store, Podman(store.root, root), root / "images")
    finally:
        podman(store, "image", "unmount", "--all", "--force")  # (none is left mounted unless a test broke)
        store.remove()
        shutil.rmtree(root, ignore_errors=True)


def test_an_image_pulled_by_reference_unpacks_root_s_and_read_only_to_others(
    place: Place, built: Built
) -> None:
    assert not place.store.has_image(built.python)  # pulled by the images' own pull
    images = place.images()
    assert images.rootfs(built.python) is None and images.problem(built.python) is None
    images.prepare(built.python, insecure=True)
    rootfs = images.wait(built.python, UNPACK_TIMEOUT)
    assert rootfs == images.rootfs(built.python) == place.images_dir / image_key(built.python) / "rootfs"
    assert images.problem(built.python) is None
    assert (rootfs / "usr/bin/python3").exists()

    for path in MOUNT_DIRS:
        assert (rootfs / path.lstrip("/")).is_dir() and not (rootfs / path.lstrip("/")).is_symlink(), path
    for path in MOUNT_FILES:
        assert (rootfs / path.lstrip("/")).is_file() and not (rootfs / path.lstrip("/")).is_symlink(), path
    for top in (place.images_dir, rootfs.parent, rootfs):
        info = top.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o755), top
    assert_shareable(rootfs)
    assert json.loads((rootfs.parent / "image.json").read_text()) == {
        "reference": built.python,
        "id": place.store.run("image", "inspect", "--format", "{{.Id}}", built.python).strip(),
        "digest": built.python_digest,
    }

    # An unprivileged user of the host reads it and changes nothing of it.
    assert as_nobody(f"cat {rootfs}/etc/os-release {rootfs}/usr/bin/python3 > /dev/null").returncode == 0
    for change in (f"touch {rootfs}/new", f"echo x >> {rootfs}/etc/hosts", f"rm -f {rootfs}/etc/os-release",
                   f"mkdir {rootfs}/tmp/mine", f"touch {place.images_dir}/new"):  # fmt: skip
        assert as_nobody(change).returncode != 0, change
    assert not [name for name in os.listdir(place.images_dir) if name.startswith(".")]  # no temporary left


def test_prepared_twice_from_two_threads_and_by_two_servers_it_is_unpacked_once(
    place: Place, built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = built.python.rsplit(":", 1)[0] + "@" + built.python_digest  # as a job names its image
    unpacked = count_calls(monkeypatch, "_unpack")
    first, second = place.images(), place.images()  # two servers on one work root
    start = threading.Barrier(4)

    def prepare(images: SlurmImages) -> None:
        start.wait()
        images.prepare(pinned, insecure=True)

    threads = [threading.Thread(target=prepare, args=(images,)) for images in (first, first, second, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rootfs = first.wait(pinned, UNPACK_TIMEOUT)
    assert second.wait(pinned, UNPACK_TIMEOUT) == rootfs
    made = rootfs.stat().st_ino

    first.prepare(pinned, insecure=True)  # ready: nothing started
    place.images().prepare(pinned, insecure=True)  # a server that restarts finds it made
    assert place.images().rootfs(pinned) == rootfs and rootfs.stat().st_ino == made
    for thread in threading.enumerate():  # the second server's maker: found it made once it had the lock
        if thread.name.startswith("slurm-image-"):
            thread.join(timeout=UNPACK_TIMEOUT)
    assert len(unpacked) == 1 and rootfs.stat().st_ino == made
    key = image_key(pinned)
    assert sorted(os.listdir(place.images_dir)) == [key, f"{key}.lock"]


def test_a_reference_the_registry_lacks_is_a_problem_that_names_it_and_leaves_nothing(
    place: Place, built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = f"{built.registry}/hyperplan/no-such-image:1"
    pulls = count_calls(monkeypatch, "_pulled")
    images = place.images()
    images.prepare(missing, insecure=True)
    with pytest.raises(ImageNotReady) as refused:
        images.wait(missing, UNPACK_TIMEOUT)
    problem = images.problem(missing)
    assert problem is not None and problem == str(refused.value)
    assert problem.startswith(f"the image {missing} could not be pulled: "), problem
    assert images.rootfs(missing) is None
    key = image_key(missing)
    assert sorted(os.listdir(place.images_dir)) == [f"{key}.failed.json", f"{key}.lock"]  # no dir, no temp
    assert json.loads((place.images_dir / f"{key}.failed.json").read_text()) == {
        "reference": missing,
        "message": problem,
    }
    images.prepare(missing, insecure=True)  # failed in this process: not tried again
    assert len(pulls) == 1 and images.problem(missing) == problem

    restarted = place.images()  # a server that restarts knows why, and tries once more
    assert restarted.problem(missing) == problem
    restarted.prepare(missing, insecure=True)
    with pytest.raises(ImageNotReady):
        restarted.wait(missing, UNPACK_TIMEOUT)
    assert len(pulls) == 2 and restarted.problem(missing) == problem and restarted.rootfs(missing) is None


@pytest.fixture(scope="module")
def private(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Python image pushed (not built again) to a registry of its own that asks for
    USERNAME's login; its reference there."""
    directory = tmp_path_factory.mktemp("slurm-images-private")
    store = PodmanStore(tmp_path_factory.mktemp("slurm-images-push-store"))
    store.prepare()
    try:
        up = script(
            "registry-dev", "up", directory, "--port", "0", "--login", USERNAME, stdin=PASSWORD + "\n"
        )
        assert up.returncode == 0, up.stderr
        reference = f"{up.stdout.strip()}/hyperplan/slurm-node:1"
        authfile = directory / "auth.json"
        login = subprocess.run(
            ["podman", "login", "--tls-verify=false", "--authfile", authfile, "--username", USERNAME,
             "--password-stdin", reference.split("/")[0]],
            input=PASSWORD, env=store.environment(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert login.returncode == 0, login.stderr
        for command in (
            ("pull", "--quiet", "--tls-verify=false", built.python),
            ("tag", built.python, reference),
            ("push", "--quiet", "--tls-verify=false", "--authfile", authfile, reference),
        ):
            done = podman(store, *command)
            assert done.returncode == 0, done.stderr
        yield reference
    finally:
        store.remove()
        script("registry-dev", "down", directory)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_registry_that_asks_for_a_login_gives_the_image_with_the_login_alone(
    place: Place, private: str
) -> None:
    images = place.images()
    images.prepare(private, insecure=True)
    with pytest.raises(ImageNotReady):
        images.wait(private, UNPACK_TIMEOUT)
    problem = images.problem(private) or ""
    assert problem.startswith(f"the image {private} could not be pulled: ") and "unauthorized" in problem

    restarted = place.images()  # (a failure is tried again by the next process, here with the login)
    restarted.prepare(private, Login(USERNAME, PASSWORD), insecure=True)
    rootfs = restarted.wait(private, UNPACK_TIMEOUT)
    assert (rootfs / "usr/bin/python3").exists() and restarted.problem(private) is None
    assert not (place.images_dir / f"{image_key(private)}.failed.json").exists()


# --- what makes a file system safe to share, on a crafted one (no image needed) -------------------


def test_a_crafted_file_system_is_made_safe_and_its_links_lead_nowhere(tmp_path: Path) -> None:
    rootfs, outside = tmp_path / "rootfs", tmp_path / "outside"
    outside.mkdir()
    (outside / "hosts").write_text("the host's own\n")
    for directory in ("usr/bin", "etc", "home/app", "var", "dev", "root"):
        (rootfs / directory).mkdir(parents=True)
    escalate = rootfs / "usr/bin/escalate"
    escalate.write_text("#!/bin/sh\n")
    os.chmod(escalate, 0o4755)
    os.link(escalate, rootfs / "usr/bin/hardlinked")
    capable = rootfs / "usr/bin/capable"
    capable.write_text("#!/bin/sh\n")
    capable.chmod(0o755)
    os.setxattr(capable, "security.capability", struct.pack("<5I", 0x02000001, 1 << CAP_SETUID, 0, 0, 0))
    os.setxattr(capable, "user.note", b"kept nowhere")
    shared = rootfs / "home/app/data"
    shared.write_text("the app's\n")
    os.chown(shared, 104, 50)
    shared.chmod(0o664)
    (rootfs / "var/drop").mkdir(mode=0o777)
    (rootfs / "var/drop").chmod(0o1777)
    os.mknod(rootfs / "dev/disk", stat.S_IFBLK | 0o666, os.makedev(7, 0))
    os.mknod(rootfs / "usr/bin/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (rootfs / "root").chmod(0o700)
    (rootfs / "opt").symlink_to(outside)  # the image's links: absolute, relative, and at a mount file
    (rootfs / "run").symlink_to("../outside")
    (rootfs / "etc/hosts").symlink_to(outside / "hosts")

    make_safe(rootfs)
    make_mount_points(rootfs)

    assert sorted(os.listdir(outside)) == ["hosts"] and (outside / "hosts").read_text() == "the host's own\n"
    for path in (*MOUNT_DIRS, *MOUNT_FILES):
        assert not (rootfs / path.lstrip("/")).is_symlink(), path
    assert (rootfs / "etc/hosts").read_text() == "" and (rootfs / "run/hyperplan/init").is_file()
    assert stat.S_IMODE((rootfs / "root").stat().st_mode) == 0o755
    assert not (rootfs / "dev/disk").exists() and not (rootfs / "usr/bin/null").exists()
    assert os.listxattr(capable) == []
    assert stat.S_IMODE(escalate.stat().st_mode) == 0o755
    info = shared.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 50, 0o644)  # the group stays
    assert stat.S_IMODE((rootfs / "var/drop").stat().st_mode) == 0o1755
    assert_shareable(rootfs)


# --- helpers --------------------------------------------------------------------------------------


def assert_shareable(rootfs: Path) -> None:
    """Nothing under ``rootfs`` lets a user of the host change it or gain by running it: every entry is
    root's, none writable by group or others, no setuid or setgid bit, no device, no extended attribute."""
    for directory, subdirectories, files in os.walk(rootfs):
        for name in (*subdirectories, *files):
            path = os.path.join(directory, name)
            info = os.lstat(path)
            assert info.st_uid == 0, path
            assert not stat.S_ISCHR(info.st_mode) and not stat.S_ISBLK(info.st_mode), path
            assert os.listxattr(path, follow_symlinks=False) == [], path
            if not stat.S_ISLNK(info.st_mode):
                assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH), path


def as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", "sh", "-c", command],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[Any, ...]]:
    """The calls of ``slurm_images.NAME`` from now on (made as before), one entry each."""
    calls: list[tuple[Any, ...]] = []
    original: Callable[..., Any] = getattr(slurm_images, name)

    def counted(*arguments: Any) -> Any:
        calls.append(arguments)
        return original(*arguments)

    monkeypatch.setattr(slurm_images, name, counted)
    return calls
