"""The Slurm back end's files: where they live under its root, and the records in them.

No Slurm here, only files (the layout is in ``slurm.py``'s docstring). The records in a node's, task's
or group's directory are the server's own (``job.json``, ``state.json``, ``terminate.json``...), read as
carefully as a tenant's all the same; the runner's (``out/exit.json``) belong to the account's user, so
they are a claim to check (``runner_records.py``), never a fact.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hyperplan.backends import tenant_files
from hyperplan.backends.base import (
    Placement,
    RunAs,
    TaskState,
    TaskStatus,
    UnknownResource,
    check_id,
)
from hyperplan.backends.layout import PASSAGE_MODE, make_dir, tail, write_atomically
from hyperplan.backends.runner_records import MAX_RECORD_BYTES, BadRecord, RunnerExit, parse_exit_record

RECORD_LIMIT = 1 << 20
"""The most bytes of one of the server's own records read (they are a few hundred)."""
KILLED = "killed"
"""The server's mark, in a task's directory, that the task still ran when the server sent it SIGKILL (the
end of a grace): it ended killed by SIGKILL, whatever the runner's record (the tenant's) says."""


@dataclass(frozen=True)
class SlurmDirs:
    """The directories under the back end's root: one per node, per task and per group of tasks."""

    root: Path

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks"

    @property
    def groups(self) -> Path:
        return self.root / "groups"

    @property
    def clears(self) -> Path:
        return self.root / "clears"

    @property
    def tools(self) -> Path:
        return self.root / "tools"

    def make(self) -> None:
        for directory in (self.root, self.nodes, self.tasks, self.groups):
            make_dir(directory, PASSAGE_MODE)
        make_dir(self.clears, 0o700)  # root's: the clearing jobs' output

    def node_dir(self, node_id: str) -> Path:
        """A known node's directory (UnknownResource for one this back end has no record of)."""
        directory = self.nodes / check_id("node id", node_id)
        if not (directory / "node.json").exists():
            raise UnknownResource(f"no node {node_id}")
        return directory

    def task_dir(self, task_id: str) -> Path:
        directory = self.tasks / check_id("task id", task_id)
        if not (directory / "task.json").exists():
            raise UnknownResource(f"no task {task_id}")
        return directory

    def task_dirs(self) -> list[Path]:
        return subdirs(self.tasks)


# --- reading and writing ----------------------------------------------------------------------------


def write_json(path: Path, value: Mapping[str, Any], mode: int = 0o600) -> None:
    write_atomically(path, json.dumps(value, indent=1, default=str).encode(), mode)


def read_json(path: Path) -> dict[str, Any] | None:
    """One of the server's own records (in a directory of its own; read as carefully as a tenant's)."""
    try:
        data = tenant_files.read_capped(path, RECORD_LIMIT)
    except tenant_files.Refused:
        return None
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None  # a file being replaced is never half-read (rename), but a foreign one might be
    return value if isinstance(value, dict) else None


def runner_exit(path: Path) -> RunnerExit | str | None:
    """How the runner says its program ended (``exit.json``, in a directory the account's user owns):
    None when it has not said, the words of the refusal when its record is not one the server takes (a
    link, a FIFO, a giant file, values out of range: the program may have rewritten it)."""
    try:
        data = tenant_files.read_capped(path, MAX_RECORD_BYTES)
        if data is None:
            return None
        return parse_exit_record(data)
    except (tenant_files.Refused, BadRecord) as refused:
        return f"its runner's record {path.parent.name}/{path.name} is refused: {refused}"


def job_id_of(directory: Path) -> int | None:
    """The Slurm job of a node, task or group, once submitted (``job.json``)."""
    record = read_json(directory / "job.json")
    return int(record["job_id"]) if record is not None else None


def subdirs(directory: Path) -> list[Path]:
    try:
        return sorted(
            entry for entry in directory.iterdir() if entry.is_dir() and not entry.name.startswith(".")
        )
    except FileNotFoundError:
        return []


# --- what the records hold --------------------------------------------------------------------------


@dataclass
class TerminateOrder:
    """``terminate.json``: the grace, and when SIGKILL is due."""

    grace: float
    deadline: float  # time.time(): real time, the same after a restart


def nonce() -> str:
    """Part of a job's name: a job of an earlier node or task with the same id is never taken for it."""
    return uuid.uuid4().hex[:8]


def placement_from(record: Mapping[str, Any] | None) -> Placement | None:
    if record is None:
        return None
    limit = record.get("time_limit")
    return Placement(
        reservation=record.get("reservation"),
        constraint=record.get("constraint"),
        time_limit=timedelta(seconds=limit) if limit is not None else None,
        group=record.get("group"),
        group_size=int(record.get("group_size", 1)),
        group_index=int(record.get("group_index", 0)),
        memory_bytes=record.get("memory_bytes"),
    )


def run_as_from(record: Mapping[str, Any]) -> RunAs | None:
    value = record.get("run_as")
    return RunAs(**value) if value else None


def grouped(record: Mapping[str, Any]) -> bool:
    """A member of a multi-node group (one Slurm job for all)."""
    placement = placement_from(record.get("placement"))
    return placement is not None and placement.group is not None and placement.group_size > 1


# --- a task's end -----------------------------------------------------------------------------------


def status_of(record: Mapping[str, Any], directory: Path | None = None) -> TaskStatus:
    message = record.get("message") or ""
    if not message and directory is not None:
        message = tail(directory / "out" / "stderr.log")
    return TaskStatus(
        TaskState(record["state"]),
        record.get("exit_code"),
        record.get("signal"),
        message,
        bool(record.get("out_of_memory", False)),
    )


def end_task(
    directory: Path,
    state: TaskState,
    exit_code: int | None = None,
    signal: int | None = None,
    message: str = "",
    out_of_memory: bool = False,
) -> TaskStatus:
    """Write down how a task ended (``state.json``): from then on its status is read from there alone."""
    record: dict[str, Any] = {
        "state": state.value,
        "exit_code": exit_code,
        "signal": signal,
        "message": message,
    }
    if out_of_memory:
        record["out_of_memory"] = True
    with contextlib.suppress(FileNotFoundError):
        write_json(directory / "state.json", record)
    return status_of(record, directory)


def end_queued_tasks(dirs: SlurmDirs, node_id: str, why: str) -> None:
    """The tasks of a node that ends before their steps were launched: Killed, with ``why``."""
    for task_dir in dirs.task_dirs():
        record = read_json(task_dir / "task.json")
        if record is None or record.get("node_id") != node_id or (task_dir / "state.json").exists():
            continue
        if not (task_dir / "launch.json").exists():
            end_task(task_dir, TaskState.KILLED, message=f"stopped: {why}")
