"""Training images pulled into the back end's Podman store, and what a job needs to know of one.

A pull logs in with the registry's sealed credentials (``services/accounts/registry_credentials.py``) through
an auth file of its own, 0600 and removed afterwards, so that the password is never on a command line
(another process could read it there) nor in Podman's shared auth file. A registry the fleet file marks
``insecure`` is spoken to over plain HTTP.

What a job needs of the image is its digest (recorded in the job's events: the reference may move on,
the digest says what ran) and how Docker and SageMaker would start it: ``docker run IMAGE train`` runs
the image's ENTRYPOINT with ``train`` as its argument, or ``train`` itself when it has none.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hyperplan.backends.base import BackendError, Login
from hyperplan.backends.containers import PULL_TIMEOUT, Podman, auth_file_text


class ImageUnavailable(BackendError):
    """The image could not be pulled: it does not exist, the registry refused or could not be reached."""


@dataclass(frozen=True)
class ImageInfo:
    reference: str
    """As pulled (the job's resolved reference)."""
    digest: str
    """``sha256:...`` of the manifest pulled: what ran."""
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    workdir: str

    @property
    def pinned(self) -> str:
        """The reference by digest (``NAME@sha256:...``), what a container is made from, so that every
        instance of a job runs the same image even if its tag moves meanwhile."""
        name = self.reference.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            name = name[: len(name) - len(last)] + last.split(":", 1)[0]
        return f"{name}@{self.digest}" if self.digest else self.reference

    def train_command(self) -> tuple[str, ...]:
        """What ``docker run IMAGE train`` runs: the ENTRYPOINT with ``train``, else ``train``."""
        return (*self.entrypoint, "train")


def pull(podman: Podman, reference: str, login: Login | None, insecure: bool) -> ImageInfo:
    """Pull ``reference`` (a no-op when the store has it by digest) and read its configuration."""
    with _auth_file(reference, login) as auth:
        arguments = ["pull", "--quiet"]
        if insecure:
            arguments.append("--tls-verify=false")
        if auth is not None:
            arguments += ["--authfile", str(auth)]
        result = podman.run(*arguments, reference, check=False, timeout=PULL_TIMEOUT)
    if result.returncode != 0:
        said = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise ImageUnavailable(
            "it could not be pulled: "
            + (said[-1].removeprefix("Error: ") if said else f"podman pull exited {result.returncode}")
        )
    return inspect(podman, reference)


def inspect(podman: Podman, reference: str) -> ImageInfo:
    found = podman.run("image", "inspect", reference, check=False)
    if found.returncode != 0:
        raise ImageUnavailable(f"{reference} is not in the store")
    image = json.loads(found.stdout)[0]
    config = image.get("Config") or {}
    return ImageInfo(
        reference=reference,
        digest=image.get("Digest") or "",
        entrypoint=tuple(config.get("Entrypoint") or ()),
        cmd=tuple(config.get("Cmd") or ()),
        workdir=config.get("WorkingDir") or "",
    )


@contextlib.contextmanager
def _auth_file(reference: str, login: Login | None) -> Iterator[Path | None]:
    """A Podman auth file (0600) for the reference's registry alone, removed once the pull is done."""
    if login is None:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="hyperplan-auth-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(auth_file_text(reference, login))
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


class PodmanImages:
    """The images of one Podman store: what the services pull a job's image with."""

    def __init__(self, podman: Podman) -> None:
        self.podman = podman

    def pull(self, reference: str, login: Login | None = None, insecure: bool = False) -> ImageInfo:
        return pull(self.podman, reference, login, insecure)
