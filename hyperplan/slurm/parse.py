"""Pure parsers of what Slurm 22.05's tools print, into frozen values.

``scontrol show node|reservation|job -o`` prints one record a line, ``Key=Value`` pairs separated by
spaces; a few values hold spaces themselves (``OS=Linux 6.1 #1 SMP``, ``Reason=disk failed [root@...]``),
so a word that does not start a ``Key=`` continues the value before it. ``sinfo --json`` and
``squeue --json`` (OpenAPI v0.0.38) are read for the same values. Times are printed in the tool's local
time without a zone: the client runs the tools with ``TZ=UTC``, so they are read here as UTC.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hyperplan.core.hostlist import expand

# A base state, then flags: IDLE, IDLE+DRAIN, DOWN+NOT_RESPONDING, MIXED+RESERVED ...
UNUSABLE_STATES = frozenset({"DOWN", "FAIL", "FUTURE", "UNKNOWN"})
UNUSABLE_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "POWERED_DOWN"})

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_/:]*=")
_REASON_STAMP = re.compile(r"\s*\[[^\]@\s]+@[^\]\s]+\]$")  # " [root@2026-11-30T22:53:58]"
_NULL = ("", "(null)", "N/A", "None", "Unknown", "n/a")


class ParseError(ValueError):
    """Output of a Slurm tool that does not read as expected (a version this parser does not know)."""


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # the base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, RESERVED, ...
    features: tuple[str, ...]  # the active features
    gres: str  # such as "gpu:h100:8"; "" for none
    partitions: tuple[str, ...]
    reason: str | None  # why an administrator (or Slurm) drained or downed it, without the stamp

    @property
    def usable(self) -> bool:
        """Slurm would start work on it: not DOWN, FAIL, DRAIN(ED), not responding."""
        return self.state not in UNUSABLE_STATES and not self.flags & UNUSABLE_FLAGS


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    start: datetime  # UTC
    end: datetime  # UTC
    users: tuple[str, ...]
    flags: frozenset[str]
    state: str  # ACTIVE or INACTIVE


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    user: str
    nodes: tuple[str, ...]
    reservation: str | None
    exit_code: int
    signal: int  # the signal that ended it, 0 for none
    # When it started and when its time limit ends it, UTC (scontrol only, so not compared; None: not
    # started, unlimited, or not said)
    start: datetime | None = field(default=None, compare=False)
    end: datetime | None = field(default=None, compare=False)


# -- scontrol show ... -o ----------------------------------------------------------------------------


def key_values(line: str) -> dict[str, str]:
    """One record of ``scontrol show ... -o``: its keys and values (a value may hold spaces)."""
    values: dict[str, str] = {}
    key: str | None = None
    for word in line.split(" "):
        match = _KEY.match(word)
        if match is not None:
            key = match[0][:-1]
            values[key] = word[match.end() :]
        elif key is not None:
            values[key] = f"{values[key]} {word}" if word else values[key]
        elif word:
            raise ParseError(f"{word!r} does not start a Key=Value pair: {line[:120]!r}")
    return {k: v.strip() for k, v in values.items()}


def _records(text: str, first_key: str) -> Iterator[dict[str, str]]:
    for line in text.splitlines():
        if not line.startswith(f"{first_key}="):
            continue  # "No reservations in the system" and the like
        yield key_values(line)


def _need(record: Mapping[str, str], key: str, what: str) -> str:
    try:
        return record[key]
    except KeyError:
        raise ParseError(f"{what} without {key}: {dict(record)!r:.160}") from None


def _list(value: str | None) -> tuple[str, ...]:
    if value is None or value in _NULL:
        return ()
    return tuple(item for item in value.split(",") if item)


def _hosts(value: str | None) -> tuple[str, ...]:
    if value is None or value in _NULL:
        return ()
    return expand(value)


def _optional(value: str | None) -> str | None:
    return None if value is None or value in _NULL else value


def parse_time(value: str) -> datetime:
    """``2026-11-30T22:54:12``, printed under TZ=UTC, as an aware UTC datetime."""
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise ParseError(f"{value!r} is not a Slurm time such as 2026-11-30T22:54:12") from None


def parse_nodes(text: str) -> tuple[Node, ...]:
    """``scontrol show node -o``."""
    return tuple(_node(record) for record in _records(text, "NodeName"))


def _node(record: Mapping[str, str]) -> Node:
    base, *flags = _need(record, "State", "a node").split("+")
    reason = _optional(record.get("Reason"))
    return Node(
        name=record["NodeName"],
        state=base.rstrip("*~#!%$@^-").upper(),
        flags=frozenset(flags),
        features=_list(record.get("ActiveFeatures", record.get("AvailableFeatures"))),
        gres=_optional(record.get("Gres")) or "",
        partitions=_list(record.get("Partitions")),
        reason=None if reason is None else _REASON_STAMP.sub("", reason) or None,
    )


def parse_reservations(text: str) -> tuple[Reservation, ...]:
    """``scontrol show reservation -o``."""
    return tuple(_reservation(record) for record in _records(text, "ReservationName"))


def _reservation(record: Mapping[str, str]) -> Reservation:
    what = "a reservation"
    return Reservation(
        name=record["ReservationName"],
        nodes=_hosts(record.get("Nodes")),
        start=parse_time(_need(record, "StartTime", what)),
        end=parse_time(_need(record, "EndTime", what)),
        users=_list(record.get("Users")),
        flags=frozenset(_list(record.get("Flags"))),
        state=_need(record, "State", what),
    )


def parse_jobs(text: str) -> tuple[Job, ...]:
    """``scontrol show job -o``."""
    return tuple(_job(record) for record in _records(text, "JobId"))


def _job(record: Mapping[str, str]) -> Job:
    exit_code, _, signal = _need(record, "ExitCode", "a job").partition(":")
    try:
        job_id, code, number = int(record["JobId"]), int(exit_code), int(signal or 0)
    except ValueError:
        raise ParseError(f"job {record['JobId']!r}: ExitCode={record['ExitCode']!r}") from None
    return Job(
        id=job_id,
        name=record.get("JobName", ""),
        state=_need(record, "JobState", "a job"),
        user=_need(record, "UserId", "a job").partition("(")[0],
        nodes=_hosts(record.get("NodeList")),
        reservation=_optional(record.get("Reservation")),
        exit_code=code,
        signal=number,
        start=_moment(record.get("StartTime")),
        end=_moment(record.get("EndTime")),
    )


def _moment(value: str | None) -> datetime | None:
    """A time ``scontrol show job`` gives, or None for ``Unknown``, ``None`` or an absent key."""
    if value is None or not value[:1].isdigit():
        return None
    return parse_time(value)


# -- sinfo --json, squeue --json ---------------------------------------------------------------------


def _document(text: str, key: str, tool: str) -> list[dict[str, Any]]:
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ParseError(f"{tool} --json printed no JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get(key), list):
        raise ParseError(f"{tool} --json printed no {key!r} list")
    errors = document.get("errors") or []
    if errors:
        raise ParseError(f"{tool} --json reported errors: {errors!r:.300}")
    return document[key]


def parse_sinfo_json(text: str) -> tuple[Node, ...]:
    """``sinfo --json``: the same nodes as ``scontrol show node -o``."""
    nodes = []
    for entry in _document(text, "nodes", "sinfo"):
        try:
            nodes.append(
                Node(
                    name=entry["name"],
                    state=str(entry["state"]).upper(),
                    flags=frozenset(str(flag).upper() for flag in entry.get("state_flags") or ()),
                    features=_list(entry.get("active_features", entry.get("features"))),
                    gres=entry.get("gres") or "",
                    partitions=tuple(entry.get("partitions") or ()),
                    reason=entry.get("reason") or None,
                )
            )
        except (KeyError, TypeError) as error:
            raise ParseError(f"sinfo --json: a node without {error}") from None
    return tuple(nodes)


def parse_squeue_json(text: str) -> tuple[Job, ...]:
    """``squeue --json``: its exit_code is a wait status (exit code << 8, or the signal)."""
    jobs = []
    for entry in _document(text, "jobs", "squeue"):
        try:
            status = int(entry.get("exit_code") or 0)
            jobs.append(
                Job(
                    id=int(entry["job_id"]),
                    name=entry.get("name", ""),
                    state=entry["job_state"],
                    user=entry.get("user_name", ""),
                    nodes=_hosts(entry.get("nodes")),
                    reservation=entry.get("resv_name") or None,
                    exit_code=status >> 8 & 0xFF,
                    signal=status & 0x7F,
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ParseError(f"squeue --json: a job without {error}") from None
    return tuple(jobs)
