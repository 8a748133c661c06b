"""Which runtime tenant work runs in: ``podman`` (each node and job instance an OCI container, walled off and
limited) or ``process`` (host processes, as before containers).

What asks, first one wins: ``serve --runtime``, the fleet file's ``[backend] runtime``, the variable
``HYPERPLAN_RUNTIME`` (:func:`request`). Nothing asking is the default: ``podman`` for a server run as root
where Podman is usable, ``process`` otherwise. An explicit ``podman`` where Podman is not usable refuses the
start, naming everything missing (the server installs nothing). On the Slurm back end ``podman`` is the
site's choice, never the default (:func:`choose`): the server pulls and unpacks images with Podman, but
the containers run on the Slurm nodes under runc (backends/slurm.py), which the server cannot inspect.

What is missing on the host is found by hyperplan/backends/runtime_choice.py (I/O); the rule that the
server must run as root is this module's, so that the whole decision is tested here without a host.

Pure: values in, a :class:`Choice` or a StartRefused out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hyperplan.errors import StartRefused

PODMAN = "podman"
PROCESS = "process"
RUNTIMES = (PODMAN, PROCESS)
RUNTIME_ENV = "HYPERPLAN_RUNTIME"

FLAG = "--runtime"
FLEET_KEY = "[backend] runtime"
DEFAULT = "the default"

# Podman runs rootful here: the containers' user namespaces map to subordinate id ranges only root can
# hand out, one per account (issue 45).
NOT_ROOT = "a server run as root (rootless containers are not served)"
SLURM_OPTS_IN = (
    "on the Slurm back end containers run on the cluster's nodes (rootless runc in each Slurm step), "
    'which the server cannot inspect: the fleet file\'s [backend] runtime = "podman" says they are '
    "ready (docs/SLURM.md)"
)
NOT_CONTAINED = (
    "runtime 'process': tenant work is NOT contained: nodes and job instances run as host processes, not "
    "in their images, with no limit on memory, processes or disk, and on the host's network; run the "
    "server as root with Podman for runtime 'podman'"
)


@dataclass(frozen=True)
class Request:
    """The runtime asked for (None: nothing asked, the default) and who asked, as a user would name it."""

    runtime: str | None
    said_by: str = DEFAULT


@dataclass(frozen=True)
class Choice:
    runtime: str  # one of RUNTIMES
    why: str  # a sentence for the start's log

    @property
    def contained(self) -> bool:
        return self.runtime == PODMAN


def check_runtime(value: str, said_by: str) -> str:
    """``value`` if it names a runtime; a StartRefused naming who said it and the runtimes there are."""
    if value not in RUNTIMES:
        raise StartRefused(f"{said_by} {value!r}: give {' or '.join(RUNTIMES)}")
    return value


def request(flag: str | None, fleet_file: str | None, variable: str | None) -> Request:
    """What asks first: the flag, then the fleet file, then the variable (empty: unset, as a shell's
    ``HYPERPLAN_RUNTIME=`` means); none of them: the default."""
    for value, said_by in ((flag, FLAG), (fleet_file, FLEET_KEY), (variable, RUNTIME_ENV)):
        if value:
            return Request(check_runtime(value, said_by), said_by)
    return Request(None)


def choose(requested: Request, *, is_root: bool, problems: Sequence[str], slurm: bool = False) -> Choice:
    """The runtime for this start. ``problems``: what the host lacks for Podman (each a short phrase naming
    the thing and how to get it); ``slurm``: the back end is Slurm's."""
    if slurm and requested.runtime is None:
        return Choice(PROCESS, f"{DEFAULT}: {SLURM_OPTS_IN}")
    missing = [*problems, NOT_ROOT] if not is_root else list(problems)
    if requested.runtime == PROCESS:
        return Choice(PROCESS, f"{requested.said_by} asks for it")
    if requested.runtime == PODMAN:
        if missing:
            raise StartRefused(
                f"{requested.said_by} podman: Podman is not usable here, it needs {'; '.join(missing)}. "
                "The server installs nothing: install them, or give process"
            )
        return Choice(PODMAN, f"{requested.said_by} asks for it")
    if not is_root:
        return Choice(
            PROCESS, f"{DEFAULT}: the server does not run as root (rootless containers are not served)"
        )
    if missing:
        return Choice(PROCESS, f"{DEFAULT}: Podman is not usable here, it needs {'; '.join(missing)}")
    return Choice(PODMAN, f"{DEFAULT}: the server runs as root and Podman is usable")
