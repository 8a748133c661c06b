"""`make run`'s runtime: the demo fleet's tenant work in containers on first use, as root (issue 45, point 5).

``python -m hyperplan.containers.demo_runtime [auto|podman|process]`` decides, sets up what runtime podman
needs for the demo fleet, and replaces itself with ``hyperplan serve`` (so Ctrl-C reaches the server):

- ``auto`` (``make run``): as root, set up, then serve with the server's own default, which is podman as
  root where Podman is usable (core/runtime_choice.py: the server checks the host, user namespaces
  included, and says why if it takes process); if a step of the setup fails, serve ``--runtime process``,
  saying which step failed and why. Not root: ``--runtime process`` at once, saying why.
- ``podman`` (``make run RUNTIME=podman``): set up, then ``--runtime podman``; a failed step, or not
  root, refuses (exit 1) and serves nothing.
- ``process`` (``make run RUNTIME=process``): ``--runtime process``, nothing set up.

The setup, each step skipped when its work is done, so that a second ``make run`` takes a second or less:

1. the host's packages: Podman, runc, catatonit, mmdebstrap and docker-registry (image_build.install,
   registry_dev.install: apt-get through hyperplan/host_packages.py);
2. a registry on 127.0.0.1:5000, the port the demo fleet's ``[image_map]``, ``node_image`` and
   ``[registries]`` name (registry_dev.up), in ``DATA_DIR/registry``. It runs on after the server stops,
   and the next ``make run`` reuses it; ``scripts/registry-dev down DATA_DIR/registry`` stops it. When
   port 5000 is held by something else, the setup fails (and ``auto`` falls back to process), unless
   what holds it is a registry that already has both demo images (one a developer brought up with
   ``scripts/registry-dev`` and ``image-dev``, docs/DEPLOY.md): that one is used, and nothing is pushed
   to it. Serving the demo fleet with another port in a fleet file of our own was the other way; it was
   not taken because the jobs a store records keep the resolved reference, port included, so a port that
   changed between starts would break them, and `make run` would serve a fleet other than the one the
   README and docs describe.
3. the demo's two images, ``hyperplan/python:3`` and ``hyperplan/sagemaker-python:3``, built and pushed
   (image_build.build, its default cache and store, shared with ``scripts/image-dev``) only when the
   registry lacks them.

The decision is pure (:func:`sets_up`, :func:`choose`), tested without a host; the rest is I/O.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hyperplan.containers import image_build, registry_dev, rootfs
from hyperplan.containers.host_tools import Refused, marked_processes, missing_packages, port_is_free

AUTO, PODMAN, PROCESS = "auto", "podman", "process"
ASKS = (AUTO, PODMAN, PROCESS)
DEMO_PORT = 5000  # the demo fleet's registry (hyperplan/fleet/demo.toml): 127.0.0.1:5000
DEMO_IMAGES = ((image_build.PYTHON_NAME, False), (image_build.SAGEMAKER_NAME, True))  # name, --sagemaker
REGISTRY_DIR = "registry"  # in the data directory
DATA_DIR_ENV = "HYPERPLAN_DATA_DIR"
SAID_BY = "make run"
NOT_CONTAINED = "tenant work runs as host processes, NOT contained"

T = TypeVar("T")


# -- the decision (pure) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """The setup step that failed (what it was doing) and why."""

    step: str
    why: str


@dataclass(frozen=True)
class Serve:
    """Serve with these arguments to ``hyperplan serve``, after saying ``say`` (None: nothing more to say
    than the server itself says)."""

    arguments: tuple[str, ...]
    say: str | None = None


@dataclass(frozen=True)
class Refusal:
    why: str


def sets_up(asked: str, *, is_root: bool) -> bool:
    """Whether to set up runtime podman before serving: as root, unless process is asked for."""
    return is_root and asked in (AUTO, PODMAN)


def choose(asked: str, *, is_root: bool, failure: Failure | None = None) -> Serve | Refusal:
    """What to serve with, given what was asked (``RUNTIME``), whether this runs as root, and the setup's
    failure (None: it succeeded, or did not run)."""
    if asked not in ASKS:
        return Refusal(f"RUNTIME={asked}: give {', '.join(ASKS)} (auto, the default: containers as root)")
    if asked == PROCESS:
        return Serve(("--runtime", PROCESS))  # the server says at its start that work is not contained
    if not is_root:
        if asked == PODMAN:
            return Refusal(
                "RUNTIME=podman needs root (rootless containers are not served): run it as root, "
                "or RUNTIME=process"
            )
        return Serve(
            ("--runtime", PROCESS),
            f"{NOT_CONTAINED}: not run as root (rootless containers are not served); as root, "
            "`make run` runs it in containers",
        )
    if failure is not None:
        # One line that says it all; what a tool said (apt-get's or the registry's last lines) below it.
        why, _, said = failure.why.partition("\n")
        failed = f"setting up containers failed at {failure.step}: {why.rstrip(':')}"
        below = f"\n{said}" if said else ""
        if asked == PODMAN:
            return Refusal(f"RUNTIME=podman: {failed}{below}")
        return Serve(("--runtime", PROCESS), f"{failed}; {NOT_CONTAINED}{below}")
    if asked == PODMAN:
        return Serve(("--runtime", PODMAN))
    # The server's default as root is podman where Podman is usable, else process saying what is missing:
    # it checks the host (user namespaces, an OCI runtime...) as no step here does.
    return Serve(())


# -- the setup ------------------------------------------------------------------------------------------


class StepFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.step}: {failure.why}")
        self.failure = failure


@dataclass(frozen=True)
class Ready:
    address: str  # 127.0.0.1:PORT
    directory: Path | None  # the registry's directory; None: a registry not ours, already holding the images
    started: bool  # this setup started the registry
    built: tuple[str, ...]  # the references this setup built and pushed
    seconds: float

    def describe(self) -> list[str]:
        if self.directory is None:
            where = f"the registry already on {self.address} (not started here), which has the demo's images"
        else:
            up = "started" if self.started else "already up"
            images = "the demo's images built into it" if self.built else "the demo's images already in it"
            where = f"the registry {self.address} {up} ({self.directory}), {images}"
        lines = [f"containers set up in {self.seconds:.1f} s: {where}"]
        if self.directory is not None:
            lines.append(
                f"the registry keeps running after the server stops, for the next `make run`; "
                f"`scripts/registry-dev down {self.directory}` stops it"
            )
        return lines


def set_up(
    data_dir: Path,
    *,
    port: int = DEMO_PORT,
    cache: Path = image_build.DEFAULT_CACHE,
    store: Path = image_build.DEFAULT_STORE,
) -> Ready:
    """Everything runtime podman needs for the demo fleet, each step done only if needed; StepFailed
    names the step that failed."""
    started = time.monotonic()
    _step("installing the host's packages", _install)
    directory = data_dir.absolute() / REGISTRY_DIR  # absolute: the registry's processes are marked with it
    address = f"127.0.0.1:{port}"
    ours, up_before = _step(f"the registry on {address}", lambda: _registry(directory, port))
    built: tuple[str, ...] = ()
    if ours:
        built = _step(f"building the demo's images into {address}", lambda: _images(address, cache, store))
    return Ready(
        address, directory if ours else None, ours and not up_before, built, time.monotonic() - started
    )


def _step(step: str, run: Callable[[], T]) -> T:
    try:
        return run()
    except (Refused, OSError, subprocess.SubprocessError) as error:
        raise StepFailed(Failure(step, str(error) or type(error).__name__)) from error


def _install() -> None:
    wanted = {**image_build.PACKAGES, **registry_dev.PACKAGES}
    absent = missing_packages(wanted)
    if absent:
        _say(f"installing {', '.join(absent)} with apt-get (once)")
    image_build.install()
    registry_dev.install()


def _registry(directory: Path, port: int) -> tuple[bool, bool]:
    """Bring this data directory's registry up on ``port``, or find one there that holds the demo's images:
    (whether the registry is ours, whether it was up before)."""
    address = f"127.0.0.1:{port}"
    if registry_dev.running_address(registry_dev.Layout(directory)) == address:
        return True, True
    ours_alive = marked_processes(registry_dev.MARK_VARIABLE, str(directory))  # up() ends one gone silent
    if not port_is_free(port) and not ours_alive:
        if registry_dev.answers(address) and all(registry_dev.has_image(address, n) for n, _ in DEMO_IMAGES):
            return False, True
        raise Refused(
            f"port {port} is taken by another program (not the registry of {directory}), and the demo "
            f"fleet pulls from {address}: free the port, or serve the demo's images there (docs/DEPLOY.md)"
        )
    _registry_up(directory, port)
    return True, False


def _registry_up(directory: Path, port: int) -> None:
    """``registry-dev up`` in a process of its own, which exits once the registry answers: the registry is
    then init's child, never this process's (which becomes the server, and would leave it a zombie when it
    is brought down while the server runs). Refused, with what it said, if it fails (ours on another port,
    say)."""
    command = [sys.executable, "-m", "hyperplan.containers.registry_dev", "up", str(directory)]
    done = subprocess.run(
        [*command, "--port", str(port)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=registry_dev.START_TIMEOUT * registry_dev.START_ATTEMPTS + 60,
    )
    if done.returncode != 0:
        raise Refused(done.stderr.strip() or f"registry-dev up exited {done.returncode}")


def _images(address: str, cache: Path, store: Path) -> tuple[str, ...]:
    built = []
    for name, sagemaker in DEMO_IMAGES:
        if registry_dev.has_image(address, name):
            continue
        _say(f"building {name} into {address} ({_build_note(cache)})")
        reference, _ = image_build.build(
            address,
            name=name,
            packages=[],
            sagemaker=sagemaker,
            plain_http=True,  # a registry on loopback, as image-dev speaks to it
            cache=cache,
            store_dir=store,
        )
        built.append(reference)
    return tuple(built)


def _build_note(cache: Path) -> str:
    """How long a build is to take: seconds from the root file system's cache, half a minute more without."""
    tarball = cache / f"{rootfs.rootfs_key(rootfs.package_list([]))}.tar"
    return "once" if tarball.exists() else "once; first its root file system, with mmdebstrap: about 30 s"


# -- the command ----------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """The server's data directory when `serve` is given none (hyperplan/app.py's default_data_dir, which
    this package may not import: a test holds the two together)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "share" / "hyperplan"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="demo_runtime", description="Set up runtime podman for the demo fleet, then serve it."
    )
    parser.add_argument("runtime", nargs="?", default=AUTO, help=f"{', '.join(ASKS)} (default {AUTO})")
    asked = parser.parse_args(argv).runtime
    is_root = os.geteuid() == 0
    failure = None
    if sets_up(asked, is_root=is_root):
        try:
            for line in set_up(default_data_dir()).describe():
                _say(line)
        except StepFailed as failed:
            failure = failed.failure
    decision = choose(asked, is_root=is_root, failure=failure)
    if isinstance(decision, Refusal):
        _say(decision.why)
        return 1
    if decision.say is not None:
        _say(decision.say)
    _serve(decision.arguments)
    return 0  # not reached: the server took this process's place


def _say(line: str) -> None:
    print(f"{SAID_BY}: {line}", file=sys.stderr, flush=True)


def _serve(arguments: tuple[str, ...]) -> None:
    """Become ``hyperplan serve ARGUMENTS``: one process, which Ctrl-C and SIGTERM reach directly."""
    sys.stdout.flush()
    command = [sys.executable, "-m", "hyperplan", "serve", *arguments]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
