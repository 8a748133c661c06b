"""The one client of a Slurm cluster: its command-line tools, run with the fleet's ``SLURM_CONF``.

Every call runs one tool with a timeout, ``SLURM_CONF`` and ``TZ=UTC`` in its environment (Slurm prints
and reads times in local time without a zone; under UTC they are UTC), and either returns what the
tool printed, parsed by :mod:`hyperplan.slurm.parse`, or raises :class:`SlurmError` naming the command
and what the tool said on stderr. Reservations are always made on nodes the caller names
(``Nodes=``, never ``NodeCnt=``, which Slurm silently shrinks when nodes are busy) and are read back
after every change.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

from hyperplan.core.hostlist import compress
from hyperplan.slurm.parse import (
    Job,
    Node,
    ParseError,
    Reservation,
    parse_jobs,
    parse_nodes,
    parse_reservations,
    parse_sinfo_json,
    parse_squeue_json,
)

DEFAULT_TIMEOUT = 30.0
_T = TypeVar("_T")


class SlurmError(Exception):
    """A Slurm tool failed, timed out, could not be run, or printed what the parsers cannot read."""

    def __init__(self, command: Sequence[str], detail: str, returncode: int | None = None) -> None:
        self.command = tuple(command)
        self.detail = detail
        self.returncode = returncode
        super().__init__(f"{' '.join(self.command)}: {detail}")


class SlurmClient:
    """Slurm's command-line tools for one cluster (the one `slurm_conf` describes)."""

    def __init__(
        self,
        slurm_conf: Path | str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.slurm_conf = Path(slurm_conf)
        self.timeout = timeout
        base = dict(os.environ if environment is None else environment)
        self.environment = {**base, "SLURM_CONF": str(self.slurm_conf), "TZ": "UTC"}

    # -- running the tools --

    def run(self, *command: str) -> str:
        """Run one tool; its standard output, or SlurmError naming the command and its stderr."""
        try:
            result = subprocess.run(
                command,
                env=self.environment,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except FileNotFoundError:
            raise SlurmError(command, f"{command[0]} not found: is Slurm installed?") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(command, f"no answer within {self.timeout:g} s") from None
        if result.returncode != 0:
            detail = result.stderr.strip() or result.stdout.strip() or f"exit status {result.returncode}"
            raise SlurmError(command, detail, result.returncode)
        return result.stdout

    def _parsed(self, parse: Callable[[str], _T], *command: str) -> _T:
        text = self.run(*command)
        try:
            return parse(text)
        except (ParseError, ValueError) as error:
            raise SlurmError(command, f"unreadable output: {error}") from None

    # -- nodes --

    def nodes(self, names: Iterable[str] | None = None) -> tuple[Node, ...]:
        """``scontrol show node -o`` (all nodes, or those named)."""
        chosen = None if names is None else list(names)
        if chosen == []:
            return ()
        command = ["scontrol", "show", "node", "-o", *([compress(chosen)] if chosen else [])]
        return self._parsed(parse_nodes, *command)

    def sinfo_nodes(self, partition: str | None = None) -> tuple[Node, ...]:
        """``sinfo --json`` (in one partition, or all)."""
        command = ["sinfo", "--json", *([f"--partition={partition}"] if partition else [])]
        return self._parsed(parse_sinfo_json, *command)

    def drain(self, names: Iterable[str], reason: str) -> None:
        if not reason.strip():
            raise ValueError("a drain needs a reason")
        self.run("scontrol", "update", f"NodeName={compress(names)}", "State=DRAIN", f"Reason={reason}")

    def resume(self, names: Iterable[str]) -> None:
        self.run("scontrol", "update", f"NodeName={compress(names)}", "State=RESUME")

    # -- reservations --

    def reservations(self) -> tuple[Reservation, ...]:
        """``scontrol show reservation -o``: every reservation of the cluster."""
        return self._parsed(parse_reservations, "scontrol", "show", "reservation", "-o")

    def reservation(self, name: str) -> Reservation | None:
        """One reservation by name, None when Slurm has none by that name."""
        try:
            found = self._parsed(parse_reservations, "scontrol", "show", "reservation", name, "-o")
        except SlurmError as error:
            if "not found" in error.detail:
                return None
            raise
        return next((r for r in found if r.name == name), None)

    def create_reservation(
        self,
        name: str,
        *,
        users: Iterable[str],
        nodes: Iterable[str],
        start: datetime | Literal["now"],
        end: datetime,
        flags: Iterable[str] = (),
    ) -> Reservation:
        """Create a reservation on exactly `nodes` for `users`, and return it as Slurm holds it."""
        user_list, node_list, flag_list = list(users), list(nodes), list(flags)
        if not user_list or not node_list:
            raise ValueError("a reservation needs at least one user and one node")
        command = [
            "scontrol", "create", "reservation", f"ReservationName={name}", f"Users={','.join(user_list)}",
            f"Nodes={compress(node_list)}", f"StartTime={_slurm_time(start)}", f"EndTime={_slurm_time(end)}",
            *([f"Flags={','.join(flag_list)}"] if flag_list else []),
        ]  # fmt: skip
        self.run(*command)
        return self._read_back(name, command)

    def update_reservation(
        self,
        name: str,
        *,
        users: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        start: datetime | Literal["now"] | None = None,
        end: datetime | None = None,
    ) -> Reservation:
        """Change what is given (the rest stays), and return the reservation as Slurm holds it."""
        changes = [
            *([f"Users={','.join(users)}"] if users is not None else []),
            *([f"Nodes={compress(nodes)}"] if nodes is not None else []),
            *([f"StartTime={_slurm_time(start)}"] if start is not None else []),
            *([f"EndTime={_slurm_time(end)}"] if end is not None else []),
        ]
        if not changes:
            raise ValueError("nothing to change")
        command = ["scontrol", "update", f"ReservationName={name}", *changes]
        self.run(*command)
        return self._read_back(name, command)

    def delete_reservation(self, name: str) -> None:
        """Delete it; Slurm refuses while any job, even a pending one, names it."""
        self.run("scontrol", "delete", f"ReservationName={name}")

    def _read_back(self, name: str, command: Sequence[str]) -> Reservation:
        found = self.reservation(name)
        if found is None:
            raise SlurmError(command, f"reservation {name} is not there after the command succeeded")
        return found

    # -- jobs --

    def jobs(self) -> tuple[Job, ...]:
        """``scontrol show job -o``: the jobs slurmctld still remembers."""
        return self._parsed(parse_jobs, "scontrol", "show", "job", "-o")

    def queue(self) -> tuple[Job, ...]:
        """``squeue --json``."""
        return self._parsed(parse_squeue_json, "squeue", "--json")

    def job(self, job_id: int) -> Job | None:
        try:
            found = self._parsed(parse_jobs, "scontrol", "show", "job", str(job_id), "-o")
        except SlurmError as error:
            if "Invalid job id" in error.detail:
                return None
            raise
        return next((job for job in found if job.id == job_id), None)

    def submit(self, script: str, options: Sequence[str] = ()) -> int:
        """``sbatch --parsable OPTIONS`` with the script on stdin; the new job's id."""
        command = ["sbatch", "--parsable", *options]
        try:
            result = subprocess.run(
                command,
                input=script,
                env=self.environment,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except FileNotFoundError:
            raise SlurmError(command, "sbatch not found: is Slurm installed?") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(command, f"no answer within {self.timeout:g} s") from None
        if result.returncode != 0:
            raise SlurmError(
                command, result.stderr.strip() or f"exit status {result.returncode}", result.returncode
            )
        try:
            return int(result.stdout.strip().split(";")[0])
        except ValueError:
            raise SlurmError(command, f"unreadable job id {result.stdout.strip()!r}") from None

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        """``scancel`` the job, or send it `signal` (``--full``: the batch script and its steps)."""
        options = ["--full", f"--signal={signal}"] if signal else []
        self.run("scancel", *options, str(job_id))


def _slurm_time(value: datetime | Literal["now"]) -> str:
    if value == "now":
        return "now"
    assert isinstance(value, datetime)
    if value.tzinfo is None:
        raise ValueError(f"{value} has no time zone; Slurm times are given in UTC")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
