"""Execution back ends: where nodes and training-job instances really run.

The contract is :class:`~hyperplan.backends.base.Backend` (read its module docstring for the rules);
:class:`~hyperplan.backends.local.LocalBackend` runs everything as processes on this machine, and
:class:`~hyperplan.backends.fake.FakeBackend` keeps it all in memory for tests. Both pass the same
contract tests (``tests/backends/contract.py``), as does :class:`~hyperplan.backends.slurm.SlurmBackend`
(nodes as Slurm jobs, tasks as job steps: ``tests/slurm/test_backend.py``, on the dev cluster).
"""

from hyperplan.backends.base import (
    ENV_DIR_VARIABLE,
    EXEC_OUTPUT_LIMIT,
    EXPIRATION_VARIABLE,
    AdoptReport,
    Backend,
    BackendError,
    ExecResult,
    LogChunk,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    NodeStatus,
    NodeUnavailable,
    Placement,
    Ref,
    SpecConflict,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
    TimedLine,
    TimedLines,
    UnknownResource,
)
from hyperplan.backends.fake import FakeBackend, FakeWorld, Program
from hyperplan.backends.local import LocalBackend

__all__ = [
    "ENV_DIR_VARIABLE",
    "EXEC_OUTPUT_LIMIT",
    "EXPIRATION_VARIABLE",
    "AdoptReport",
    "Backend",
    "BackendError",
    "ExecResult",
    "FakeBackend",
    "FakeWorld",
    "LocalBackend",
    "LogChunk",
    "LogStream",
    "NodeRef",
    "NodeSpec",
    "NodeState",
    "NodeStatus",
    "NodeUnavailable",
    "Placement",
    "Program",
    "Ref",
    "SpecConflict",
    "TaskRef",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "TimedLine",
    "TimedLines",
    "UnknownResource",
]
