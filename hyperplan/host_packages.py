"""Debian's packages that a dev tool needs, installed with apt-get when missing.

The dev tools (scripts/postgres-dev, scripts/slurm-dev-cluster, scripts/registry-dev and image-dev) and
the tests that run them install what they run on first use, so a fresh machine needs no setup step:

- ``missing(packages)``: those dpkg does not list as installed (dpkg-query, not a program on PATH: a
  package half installed or removed with its configuration kept is missing);
- ``ensure(packages, why=...)``: apt-get install those, or raise ``PackagesRefused`` saying why not.

How ``ensure`` installs, and why:

- one install at a time across processes (test workers start dev tools at once), on a lock of its own,
  and the missing ones found again once it is held: a process that waited finds the work done;
- apt-get waits for dpkg's lock (``DPkg::Lock::Timeout``) rather than failing while something else
  installs, retries a download that failed (``Acquire::Retries``), and never asks: no terminal
  (``DEBIAN_FRONTEND=noninteractive``, standard input closed), no prompt about a configuration file;
- ``--no-install-recommends``: the tools need their dependencies only;
- ``apt-get update`` only when the install failed because the package lists are old or absent (no
  candidate, an archive gone from the mirror): updating costs seconds, and most machines' lists do;
- every apt-get run has a time bound, and so does the wait for another process's install.

A leaf module: nothing of hyperplan, imported by the dev tools' layers (tests/test_layers.py).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

INSTALL_LOCK = Path("/run/lock/hyperplan-host-packages.lock")
APT_TIMEOUT = 900.0  # one apt-get run: a first install of PostgreSQL or Podman downloads tens of MB
DPKG_LOCK_TIMEOUT = 600  # seconds apt-get waits for dpkg's lock, held by an install outside hyperplan
LOCK_TIMEOUT = 2 * APT_TIMEOUT + 60  # another process's install, then update, then install again
TAIL_LINES = 10

# apt-get's words (in the C locale) for a failure that fresh package lists may cure.
_STALE_LISTS = (
    "Unable to locate package",
    "has no installation candidate",
    "Unable to fetch some archives",
    "404  Not Found",
)

_APT_OPTIONS = (
    f"DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT}",
    "Acquire::Retries=3",
    # An upgraded dependency whose configuration file was changed here keeps it, without asking.
    "Dpkg::Options::=--force-confdef",
    "Dpkg::Options::=--force-confold",
)


class PackagesRefused(Exception):
    """The packages cannot be installed here; the message names them and says why."""


def missing(packages: Iterable[str]) -> list[str]:
    """The packages, in the order given, that dpkg does not list as installed (all of them on a host
    without dpkg)."""
    return [package for package in packages if not _installed(package)]


def ensure(packages: Iterable[str], *, why: str) -> None:
    """Install the packages that are missing with apt-get; ``why`` (what needs them) goes into a refusal.

    Raises PackagesRefused when this host has no apt-get, when not root, or when apt-get fails.
    """
    wanted = list(packages)
    absent = missing(wanted)
    if not absent:
        return
    names = " ".join(absent)
    if not shutil.which("apt-get"):
        raise PackagesRefused(
            f"{names} not installed ({why}), and this host has no apt-get: install them by hand"
        )
    if os.geteuid() != 0:
        raise PackagesRefused(
            f"{names} not installed ({why}); installing needs root: run this as root, "
            f"or apt-get install {names} first"
        )
    with _install_lock():
        needed = missing(wanted)  # another process may have installed them while this one waited
        if needed:
            _install(needed, why)
    still = missing(wanted)
    if still:
        raise PackagesRefused(
            f"apt-get install {names} succeeded, but dpkg lists {' '.join(still)} as not installed"
        )


def _installed(package: str) -> bool:
    try:
        listed = subprocess.run(
            ["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}\n", package],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    # One line per architecture installed: "ii " (or "hi ", held) when installed and well; the second
    # letter is the state, the third an error flag ("R": reinstall required).
    return listed.returncode == 0 and any(
        len(line) >= 2 and line[1] == "i" and line[2:3] != "R" for line in listed.stdout.splitlines()
    )


def _install(packages: list[str], why: str) -> None:
    install = ["install", "-y", "-q", "--no-install-recommends", *packages]
    result = _apt_get(install)
    if result.returncode == 0:
        return
    said = result.stdout
    if any(words in said for words in _STALE_LISTS):
        update = _apt_get(["update", "-q"])
        result = _apt_get(install)
        if result.returncode == 0:
            return
        said = (update.stdout if update.returncode != 0 else "") + result.stdout
    raise PackagesRefused(f"could not install {' '.join(packages)} ({why}) with apt-get:\n{_tail(said)}")


def _apt_get(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    options = [argument for option in _APT_OPTIONS for argument in ("-o", option)]
    command = ["apt-get", *options, *arguments]
    # The C locale: the refusal's lines and the words looked for in them are apt's own.
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    try:
        return subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream: the tail reads in the order apt-get wrote it
            text=True,
            timeout=APT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise PackagesRefused(
            f"apt-get {' '.join(arguments)} did not finish within {APT_TIMEOUT / 60:.0f} minutes"
        ) from None


@contextmanager
def _install_lock() -> Iterator[None]:
    """Hold the lock every ensure() installs under, waiting at most LOCK_TIMEOUT for another's install."""
    INSTALL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(INSTALL_LOCK, "a") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PackagesRefused(
                        f"another process has been installing packages for {LOCK_TIMEOUT / 60:.0f} minutes "
                        f"(it holds {INSTALL_LOCK})"
                    ) from None
                time.sleep(0.2)
        yield  # the lock goes with the file's closing


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-TAIL_LINES:])
