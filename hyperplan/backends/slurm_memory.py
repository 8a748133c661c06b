"""Whether a task's program on Slurm ended because its memory limit (``--mem``, held by ``task/cgroup``)
made the kernel kill a process of it, as Slurm says so.

Without accounting Slurm keeps no step's state after it ends, so each kind of task has its own witness:

- a sandbox (a one-instance job: its batch script is the runner) ends with its job ``OUT_OF_MEMORY``
  (``scontrol show job``: Slurm's record, out of the tenant's reach);
- a group's member (one instance of a multi-node job, one task of the group's ``srun``): the
  ``slurmstepd`` of the member's node writes ``slurmstepd-NODE: error: Detected N oom-kill event(s) in
  StepId=J.0`` to the step's error file as soon as the node's part of the step ends, while the others
  may run on; that file is written as the account's user, so this is the tenant's word, as the runner's
  records are (docs/SLURM.md): a forged line only renames its own job's failure;
- a node task (a step of its own, whose ``srun`` the server runs): srun says ``task 0: Out Of Memory``
  in ``srun.log``, the server's file.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from signal import SIGKILL
from typing import Any

from hyperplan.backends import tenant_files
from hyperplan.backends.runner_records import RunnerExit
from hyperplan.backends.slurm_records import RECORD_LIMIT, read_json
from hyperplan.slurm.parse import Job

JOB_STATE = "OUT_OF_MEMORY"
STEP_WORDS = "Out Of Memory"  # srun's: "srun: error: NODE: task 0: Out Of Memory"
WORD_WAIT_SECONDS = 5.0
"""A group's member whose program was SIGKILLed is settled once its node's slurmstepd has said whether
memory did it, or this long after the server first saw its record (the word follows the runner's end
within a second: the node's part of the step ends right after)."""
SEEN = "killed-seen"  # in the task's directory (the server's): when the record was first seen


def sandbox_out_of_memory(job: Job | None) -> bool:
    return job is not None and job.state == JOB_STATE


def step_out_of_memory(srun_words: str) -> bool:
    return STEP_WORDS in srun_words


def member_out_of_memory(group: Path, job: Job | None, index: int) -> bool:
    """Whether the slurmstepd of member ``index``'s node (the group job's node of that index) said that
    memory killed a process of its part of the step."""
    if job is None or not 0 <= index < len(job.nodes):
        return False
    said = re.compile(
        rf"^slurmstepd-{re.escape(job.nodes[index])}: error: Detected \d+ oom-kill event\(s\) "
        rf"in StepId={job.id}\.\d+",
        re.MULTILINE,
    )
    return any(said.search(text) for text in _step_error_files(group))


def awaiting_word(directory: Path, ended: RunnerExit | str | None, known: bool) -> bool:
    """A member whose program was SIGKILLed, with no word of memory yet: wait for it a little (see
    ``WORD_WAIT_SECONDS``), from the first time the server saw the record."""
    if known or not isinstance(ended, RunnerExit) or ended.signal != SIGKILL:
        return False
    seen = directory / SEEN
    if not seen.exists():
        seen.touch()
    return time.time() - seen.stat().st_mtime < WORD_WAIT_SECONDS


def _step_error_files(group: Path) -> list[str]:
    """The group's srun error file: in the out/ of the member whose look submitted the group (the
    account's user writes it; read as a tenant's file, capped, no link followed)."""
    record: Mapping[str, Any] = read_json(group / "group.json") or {}
    members: Sequence[Any] = record.get("members", [])
    texts = []
    for member in members:
        path = Path(str(member)) / "out" / "srun.log"
        try:
            size = path.lstat().st_size
        except OSError:
            continue
        tail = tenant_files.read_at(path, max(0, size - RECORD_LIMIT), RECORD_LIMIT)  # slurmstepd's last
        texts.append(tail.decode(errors="replace"))
    return texts
