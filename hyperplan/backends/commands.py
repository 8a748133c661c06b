"""``Backend.exec`` for back ends that run a command as a task of its own on the node (local, Slurm):
the task started, waited for up to its timeout, killed past it, its output's head read, and forgotten.
Only the contract's own methods are used, so each back end keeps its rules in one place."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta

from hyperplan.backends.base import (
    Backend,
    BackendError,
    ExecResult,
    LogStream,
    NodeState,
    NodeUnavailable,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
)


def run_command(
    backend: Backend,
    node_id: str,
    argv: Iterable[str],
    timeout: timedelta,
    env: Mapping[str, str] | None,
    output_limit: int,
    kill_wait: float,
) -> ExecResult:
    """What ``exec`` answers; ``kill_wait``: how long a command killed at its timeout may take to end."""
    state = backend.node_status(node_id).state
    if state is not NodeState.RUNNING:
        raise NodeUnavailable(f"node {node_id} is {state}: commands run only on Running nodes")
    # A command is a task of its own, with an id no caller can choose; after a crash, adopt kills it.
    ref = TaskRef(f"exec-{uuid.uuid4().hex}")
    backend.run(TaskSpec(ref.task_id, tuple(argv), node_id, dict(env or {})))
    try:
        status = wait_final(backend, ref.task_id, timeout.total_seconds())
    except BackendError:
        # The back end stopped answering (Slurm's controller, say): the command must not run on
        # unseen, so it is killed if that can be done now (else a restart's adopt ends it).
        with contextlib.suppress(BackendError):
            backend.terminate(ref, timedelta(0))
        raise
    timed_out = not status.state.is_final()
    if timed_out:
        backend.terminate(ref, timedelta(0))  # SIGKILL due at once
        status = wait_final(backend, ref.task_id, kill_wait)
    stdout, stdout_truncated = _head(backend, ref, LogStream.STDOUT, output_limit)
    stderr, stderr_truncated = _head(backend, ref, LogStream.STDERR, output_limit)
    with contextlib.suppress(NodeUnavailable):
        backend.forget(ref)
    if status.state is TaskState.LOST:  # it never ran, or no one knows how it ended: not an exit code
        raise NodeUnavailable(f"the command on node {node_id} was lost: {status.message}")
    return ExecResult(
        exit_code=None if timed_out else status.exit_code,
        stdout=stdout,
        stderr=stderr,
        signal=status.signal,
        timed_out=timed_out,
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
    )


def wait_final(backend: Backend, task_id: str, seconds: float) -> TaskStatus:
    """The task's status once it is final, or when `seconds` have passed (polled, quickly at first)."""
    until = time.monotonic() + seconds
    pause = 0.005
    while True:
        status = backend.task_status(task_id)
        if status.state.is_final() or time.monotonic() >= until:
            return status
        time.sleep(min(pause, max(0.0, until - time.monotonic())))
        pause = min(pause * 2, 0.2)


def _head(backend: Backend, ref: TaskRef, stream: LogStream, limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of a stream, and whether there is more: never more than one byte over
    the limit is read, whatever the log's size."""
    data = backend.read_log(ref, stream, 0, limit + 1).data
    return data[:limit], len(data) > limit
