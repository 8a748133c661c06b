"""Root file systems built from Debian's packages by ``mmdebstrap``, cached by what they hold.

``cached_rootfs(CACHE, packages)`` returns ``CACHE/KEY.tar``, building it first if it is not there:
``mmdebstrap --variant=minbase --include=python3,PACKAGES bookworm``, from the Debian mirrors the host's
apt uses for bookworm (its sources.list and sources.list.d; Debian's own mirrors if it names none).
``python3`` is the interpreter with its standard library (``json``, ``pathlib``, ``shutil``,
``logging``, ``sqlite3``, ``ssl``, ...), which a team's script expects of a Python image, as it gets it in
SageMaker's framework images and Docker's ``python:3``; ``python3-minimal`` lacks most of it. Debian
keeps apart what ``--packages`` can add: ``python3-venv`` (ensurepip), ``python3-pip``,
``ca-certificates`` (for HTTPS) and ``tzdata`` (for ``zoneinfo``).

KEY is a digest of the suite, the variant and the sorted package list, so two builds that want the same
packages (image-dev's plain and SageMaker images) share one tarball; a lock per key makes a second
builder wait for the first one's tarball rather than build it again. The cache never expires: delete a
tarball to build it afresh (with today's security updates).

The build leaves out documentation, manual pages and translations (a quarter of a minimal system), and
runs in a tmpfs when ``/dev/shm`` has room: on a disk, dpkg's syncs and the removal of mmdebstrap's
working tree took two thirds of a 90 s build here (of python3-minimal), against 25 s in memory. On this
project's 2-core machine, in memory, python3's system took 29 s and 33 s in two builds and is a 171 MB
tarball (58 MB as the registry's gzipped layer); python3-minimal's took 29 s and was 151 MB (51 MB).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hyperplan.containers.host_tools import Refused, file_tail, locked

SUITE = "bookworm"
VARIANT = "minbase"
BASE_PACKAGES = ("python3",)  # the interpreter and its standard library
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy 5.6.1
BUILD_TIMEOUT = 900.0
TMPFS = Path("/dev/shm")
TMPFS_ROOM = 2 << 30  # a minimal system with a few packages, and its packages, with room to spare
SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_PARTS = Path("/etc/apt/sources.list.d")

# dpkg path filters: no documentation, manual pages or translations (but each package's copyright).
SLIMMING = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)


@dataclass(frozen=True)
class Rootfs:
    tarball: Path
    key: str
    packages: tuple[str, ...]
    built_seconds: float | None  # None: taken from the cache


def package_list(extra: Iterable[str]) -> tuple[str, ...]:
    """python3 and the packages asked for, each once, sorted; Refused for a name Debian cannot
    have (it would reach mmdebstrap's command line)."""
    wanted = {*BASE_PACKAGES, *(name.strip() for name in extra if name.strip())}
    wrong = sorted(name for name in wanted if not PACKAGE_NAME.fullmatch(name))
    if wrong:
        raise Refused(f"not a Debian package name: {', '.join(wrong)}")
    return tuple(sorted(wanted))


def rootfs_key(packages: Sequence[str], suite: str = SUITE) -> str:
    text = json.dumps({"suite": suite, "variant": VARIANT, "packages": sorted(packages)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_rootfs(cache: Path, packages: Sequence[str], suite: str = SUITE) -> Rootfs:
    key = rootfs_key(packages, suite)
    tarball = cache / f"{key}.tar"
    with locked(cache / f"{key}.lock"):
        if tarball.exists():
            return Rootfs(tarball, key, tuple(packages), None)
        started = time.monotonic()
        _build(tarball, packages, suite)
        (cache / f"{key}.json").write_text(json.dumps({"suite": suite, "packages": list(packages)}) + "\n")
        return Rootfs(tarball, key, tuple(packages), time.monotonic() - started)


def _build(tarball: Path, packages: Sequence[str], suite: str) -> None:
    partial = tarball.with_suffix(".tar.part")
    log = tarball.with_suffix(".log")
    sources = host_sources(suite)
    command = [
        "mmdebstrap", f"--variant={VARIANT}", f"--include={','.join(packages)}", "--format=tar",
        "--dpkgopt=force-unsafe-io", *(f"--dpkgopt={rule}" for rule in SLIMMING),
        suite, str(partial), *(["-"] if sources else []),
    ]  # fmt: skip
    env = dict(os.environ)
    if _tmpfs_has_room():
        env["TMPDIR"] = str(TMPFS)
    with open(log, "w") as out:
        try:
            result = subprocess.run(
                command,
                input="".join(line + "\n" for line in sources),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=BUILD_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            raise Refused(
                f"mmdebstrap did not finish within {BUILD_TIMEOUT:.0f} s (its log: {log})"
            ) from None
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise Refused(f"mmdebstrap failed (its log: {log}):\n{file_tail(log)}")
    partial.rename(tarball)


def _tmpfs_has_room() -> bool:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        stat = os.statvfs(TMPFS)
    except OSError:
        return False
    is_tmpfs = any(line.split()[1:3] == [str(TMPFS), "tmpfs"] for line in mounts if len(line.split()) > 2)
    return is_tmpfs and stat.f_bavail * stat.f_frsize >= TMPFS_ROOM


# -- the host's mirrors ---------------------------------------------------------------------------------


def host_sources(suite: str = SUITE) -> list[str]:
    """The host's apt sources for `suite` and its companions (``bookworm-updates``, ``bookworm-security``),
    as one-line entries; empty when it names none (mmdebstrap then uses Debian's own mirrors)."""
    one_line = [SOURCES_LIST, *sorted(SOURCES_PARTS.glob("*.list"))]
    entries = [source for path in one_line for source in parse_one_line(_read(path))]
    entries += [
        source for path in sorted(SOURCES_PARTS.glob("*.sources")) for source in parse_deb822(_read(path))
    ]
    return [entry.line() for entry in entries if entry.serves(suite)]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Source:
    uri: str
    suite: str
    components: tuple[str, ...]
    signed_by: str | None = None

    def serves(self, suite: str) -> bool:
        return (self.suite == suite or self.suite.startswith(suite + "-")) and self.uri.startswith(
            ("http://", "https://")
        )

    def line(self) -> str:
        options = f"[signed-by={self.signed_by}] " if self.signed_by else ""
        return f"deb {options}{self.uri} {self.suite} {' '.join(self.components)}"


def parse_one_line(text: str) -> list[Source]:
    """``deb [option=value ...] URI SUITE COMPONENT...`` lines (``deb-src`` and comments skipped)."""
    found = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        match = re.fullmatch(r"deb\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?P<rest>.+)", line)
        if not match:
            continue
        words = match["rest"].split()
        if len(words) < 3:
            continue
        options = dict(o.split("=", 1) for o in (match["options"] or "").split() if "=" in o)
        found.append(Source(words[0], words[1], tuple(words[2:]), options.get("signed-by")))
    return found


def parse_deb822(text: str) -> list[Source]:
    """Paragraphs of a ``.sources`` file: ``Types``, ``URIs``, ``Suites``, ``Components``, ``Signed-By``,
    ``Enabled``. A Signed-By that holds the key itself (several lines) is dropped: apt's trusted keys then
    apply."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        fields = _fields(paragraph)
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        signed_by = fields.get("signed-by")
        if signed_by is not None and ("\n" in signed_by or not signed_by.strip()):
            signed_by = None
        components = tuple(fields.get("components", "").split())
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                found.append(Source(uri, suite, components, signed_by.strip() if signed_by else None))
    return found


def _fields(paragraph: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    name = None
    for line in paragraph.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t" and name is not None:
            fields[name] += "\n" + line.strip()
        elif ":" in line:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            fields[name] = value.strip()
    return fields
