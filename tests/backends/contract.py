"""The back-end contract as tests: every back end must pass them all.

A test module subclasses :class:`BackendContract` and gives it a ``harness`` fixture: a :class:`Harness`
that knows how to make its back end run a :class:`~hyperplan.backends.fake.Program` (a real script for
a real back end, a registered program for the fake) and how to "crash the server" (drop the back end
without a word and make a new one over the same state). Waits poll with generous timeouts; grace periods
are real time, so a few tests take about a second.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from signal import SIGKILL, SIGTERM
from typing import TypeVar

import pytest

from hyperplan.backends import (
    EXEC_OUTPUT_LIMIT,
    EXPIRATION_VARIABLE,
    Backend,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    NodeStatus,
    NodeUnavailable,
    Placement,
    Program,
    SpecConflict,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
    UnknownResource,
)

T = TypeVar("T")
INSTANCE_TYPE = "ml.p5.48xlarge"
NODE = "i-0123456789abcdef0"
OTHER_NODE = "i-0fedcba9876543210"
SECOND = timedelta(seconds=1)
LONG = timedelta(minutes=10)


class Harness(ABC):
    backend: Backend

    @abstractmethod
    def command(self, program: Program) -> tuple[str, ...]:
        """An argv that runs ``program``."""

    @abstractmethod
    def lifecycle(self, program: Program) -> tuple[Path, str]:
        """A (lifecycle_source, on_create) pair whose OnCreate runs ``program``."""

    @abstractmethod
    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        """Wait until a task's process has ended by itself, as the machine sees it, without asking the
        back end (as while no server runs). True once it has ended."""

    @abstractmethod
    def restart(self) -> Backend:
        """The server crashes: the back end is dropped (its timers stop, nothing else happens) and a new
        one is made over the same state. Returns it (also ``self.backend`` from now on)."""


def node_spec(lifecycle: tuple[Path, str] | None = None, node_id: str = NODE) -> NodeSpec:
    source, script = lifecycle or (None, None)
    name = f"ip-10-1-0-{node_id[-1]}"
    return NodeSpec(node_id, name, INSTANCE_TYPE, lifecycle_source=source, on_create=script)


def eventually(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 30.0) -> T:
    until = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > until:
            return value
        time.sleep(0.02)


def node_settled(backend: Backend, node_id: str = NODE) -> NodeStatus:
    return eventually(
        lambda: backend.node_status(node_id), lambda status: status.state is not NodeState.PENDING
    )


def node_gone(backend: Backend, node_id: str = NODE) -> NodeStatus:
    return eventually(lambda: backend.node_status(node_id), lambda status: status.state.is_final())


def task_final(backend: Backend, task_id: str, timeout: float = 30.0) -> TaskStatus:
    return eventually(lambda: backend.task_status(task_id), lambda status: status.state.is_final(), timeout)


def task_running(backend: Backend, task_id: str) -> TaskStatus:
    return eventually(
        lambda: backend.task_status(task_id), lambda status: status.state is not TaskState.PENDING
    )


READY = b"ready\n"


def task_ready(backend: Backend, task_id: str) -> None:
    """Wait until the task has said READY: a running process may not have set its signal handlers yet,
    and a SIGTERM before that would find the default action."""
    chunk = eventually(
        lambda: backend.read_log(TaskRef(task_id), LogStream.STDOUT), lambda c: READY in c.data
    )
    assert READY in chunk.data, chunk
    # The process can print before its node agent has recorded it started (the pid comes from the
    # spawn): until then its status is still Pending, which a test of what follows must not mistake.
    status = eventually(lambda: backend.task_status(task_id), lambda s: s.state is TaskState.RUNNING)
    assert status.state is TaskState.RUNNING, status


class BackendContract:
    """The rules of ``hyperplan.backends.base``, checked. Subclasses provide ``harness``."""

    @pytest.fixture
    def harness(self) -> Harness:
        raise NotImplementedError

    def running_node(self, harness: Harness, node_id: str = NODE, **env: str) -> None:
        harness.backend.provision(NodeSpec(node_id, f"ip-10-1-0-{node_id[-1]}", INSTANCE_TYPE, env=env))
        status = node_settled(harness.backend, node_id)
        assert status.state is NodeState.RUNNING, status

    # --- provisioning ----------------------------------------------------------------------------

    def test_a_node_without_on_create_runs(self, harness: Harness) -> None:
        assert isinstance(harness.backend, Backend)
        self.running_node(harness)

    def test_a_node_can_be_terminated_while_on_create_runs(self, harness: Harness) -> None:
        backend = harness.backend
        backend.provision(node_spec(harness.lifecycle(Program.runs(on_term=None, stdout=READY))))
        on_create_log = lambda: backend.read_log(NodeRef(NODE), LogStream.STDOUT)  # noqa: E731
        eventually(on_create_log, lambda chunk: READY in chunk.data)
        assert backend.node_status(NODE).state is NodeState.PENDING
        backend.terminate(NodeRef(NODE), timedelta(seconds=0.3))
        assert node_gone(backend).state is NodeState.TERMINATED

    def test_on_create_keeps_the_node_pending_until_it_exits_0(self, harness: Harness) -> None:
        backend = harness.backend
        backend.provision(node_spec(harness.lifecycle(Program.exits(0, after=0.6, stdout=b"mounted /fsx\n"))))
        assert backend.node_status(NODE).state is NodeState.PENDING
        assert node_settled(backend) == NodeStatus(NodeState.RUNNING)
        assert backend.read_log(NodeRef(NODE), LogStream.STDOUT).data == b"mounted /fsx\n"

    def test_a_failing_on_create_fails_the_node_with_its_error_output(self, harness: Harness) -> None:
        backend = harness.backend
        backend.provision(node_spec(harness.lifecycle(Program.exits(3, stderr=b"cannot mount /fsx\n"))))
        status = node_settled(backend)
        assert status.state is NodeState.FAILURE
        assert "cannot mount /fsx" in status.message and "3" in status.message
        with pytest.raises(NodeUnavailable):
            backend.run(TaskSpec("late", harness.command(Program.exits(0)), NODE))

    def test_provision_is_idempotent_and_refuses_another_spec(self, harness: Harness) -> None:
        spec = NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE)
        harness.backend.provision(spec)
        harness.backend.provision(spec)
        status = node_settled(harness.backend)
        assert status.state is NodeState.RUNNING, status
        harness.backend.provision(spec)
        with pytest.raises(SpecConflict):
            harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-2", INSTANCE_TYPE))
        with pytest.raises(SpecConflict):  # where it runs is part of the spec
            harness.backend.provision(replace(spec, placement=Placement(constraint=INSTANCE_TYPE)))

    def test_unknown_ids(self, harness: Harness) -> None:
        backend = harness.backend
        with pytest.raises(UnknownResource):
            backend.node_status(NODE)
        with pytest.raises(UnknownResource):
            backend.task_status("nothing")
        with pytest.raises(UnknownResource):
            backend.run(TaskSpec("t", harness.command(Program.exits(0)), NODE))
        with pytest.raises(UnknownResource):
            backend.terminate(TaskRef("nothing"), SECOND)
        backend.forget(NodeRef(NODE))
        backend.forget(TaskRef("nothing"))

    # --- tasks -----------------------------------------------------------------------------------

    def test_a_task_reports_its_exit_code_output_and_error_output(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        spec = TaskSpec("t-1", harness.command(Program.exits(7, stdout=b"out\n", stderr=b"trouble\n")), NODE)
        backend.run(spec)
        backend.run(spec)
        status = task_final(backend, "t-1")
        assert (status.state, status.exit_code, status.signal) == (TaskState.EXITED, 7, None)
        assert "trouble" in status.message
        first = backend.read_log(TaskRef("t-1"), LogStream.STDOUT)
        assert (first.data, first.next_offset) == (b"out\n", 4)
        assert backend.read_log(TaskRef("t-1"), LogStream.STDOUT, first.next_offset).data == b""
        with pytest.raises(SpecConflict):
            backend.run(TaskSpec("t-1", harness.command(Program.exits(0)), NODE))

    def test_a_task_waits_for_its_node_to_run(self, harness: Harness) -> None:
        backend = harness.backend
        backend.provision(node_spec(harness.lifecycle(Program.exits(0, after=0.8))))
        backend.run(TaskSpec("t-1", harness.command(Program.exits(0)), NODE))
        assert backend.task_status("t-1").state is TaskState.PENDING
        assert task_final(backend, "t-1").state is TaskState.EXITED
        assert backend.node_status(NODE).state is NodeState.RUNNING

    def test_a_task_without_a_node_runs_in_a_sandbox_of_its_own(self, harness: Harness) -> None:
        backend = harness.backend
        backend.run(TaskSpec("job-algo-1", harness.command(Program.exits(0, stdout=b"trained\n"))))
        status = task_final(backend, "job-algo-1")
        assert (status.state, status.exit_code) == (TaskState.EXITED, 0)
        assert backend.read_log(TaskRef("job-algo-1"), LogStream.STDOUT).data == b"trained\n"
        with pytest.raises(UnknownResource):
            backend.node_status("job-algo-1")

    def test_every_line_of_output_carries_the_time_it_was_written(self, harness: Harness) -> None:
        backend = harness.backend
        before = datetime.now(UTC) - timedelta(milliseconds=1)
        backend.provision(node_spec(harness.lifecycle(Program.exits(0, stdout=b"mounted /fsx\n"))))
        program = Program.exits(0, stdout=b"one\ntwo\nthree", stderr=b"careful\n")
        backend.run(TaskSpec("job-algo-1", harness.command(program)))
        task_final(backend, "job-algo-1")
        node_settled(backend)
        after = datetime.now(UTC) + timedelta(milliseconds=1)
        first = backend.read_lines(TaskRef("job-algo-1"), limit=2)
        rest = backend.read_lines(TaskRef("job-algo-1"), first.next_cursor)
        lines = first.lines + rest.lines
        assert len(first.lines) == 2 and first.next_cursor != 0
        assert [line.text for line in lines if line.stream is LogStream.STDOUT] == ["one", "two", "three"]
        assert [line.text for line in lines if line.stream is LogStream.STDERR] == ["careful"]
        assert all(before <= line.time <= after for line in lines), lines
        assert backend.read_lines(TaskRef("job-algo-1"), rest.next_cursor).lines == ()
        on_create = backend.read_lines(NodeRef(NODE)).lines
        assert [(line.stream, line.text) for line in on_create] == [(LogStream.STDOUT, "mounted /fsx")]
        assert before <= on_create[0].time <= after
        # The bytes as written are still there, unchanged, for whoever reads them by offset.
        assert backend.read_log(TaskRef("job-algo-1"), LogStream.STDOUT).data == b"one\ntwo\nthree"
        # A read bounded in bytes stops at the line that reaches the bound, and goes on right after it.
        bounded = backend.read_lines(TaskRef("job-algo-1"), max_bytes=4)
        assert [line.text for line in bounded.lines] in (["one", "two"], ["one", "careful"], ["careful"])
        after = backend.read_lines(TaskRef("job-algo-1"), bounded.next_cursor)
        assert bounded.lines + after.lines == lines

    # --- signals and terminate -------------------------------------------------------------------

    def test_a_task_that_obeys_sigterm_ends_before_its_grace(self, harness: Harness) -> None:
        backend = harness.backend
        backend.run(TaskSpec("job-algo-1", harness.command(Program.runs(on_term=143, stdout=READY))))
        task_ready(backend, "job-algo-1")
        backend.terminate(TaskRef("job-algo-1"), LONG)
        status = task_final(backend, "job-algo-1", timeout=5)
        assert (status.state, status.exit_code) == (TaskState.EXITED, 143)

    def test_a_task_that_ignores_sigterm_is_killed_when_its_grace_has_passed(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        backend.run(TaskSpec("t-1", harness.command(Program.runs(on_term=None, stdout=READY)), NODE))
        task_ready(backend, "t-1")
        started = time.monotonic()
        backend.terminate(TaskRef("t-1"), SECOND)
        backend.terminate(TaskRef("t-1"), LONG)  # a later deadline changes nothing
        # Every look within the grace finds it running (no fixed wait: the looks run until it ends).
        seen: list[tuple[float, TaskStatus]] = []

        def look() -> TaskStatus:
            seen.append((time.monotonic(), backend.task_status("t-1")))
            return seen[-1][1]

        status = eventually(look, lambda status: status.state.is_final())
        within_grace = [seen_status.state for at, seen_status in seen if at - started < 0.9]
        assert within_grace and set(within_grace) == {TaskState.RUNNING}, within_grace
        assert time.monotonic() - started >= 1.0
        assert (status.state, status.signal) == (TaskState.KILLED, SIGKILL)
        assert backend.node_status(NODE).state is NodeState.RUNNING

    def test_the_nearer_deadline_wins(self, harness: Harness) -> None:
        backend = harness.backend
        backend.run(TaskSpec("job-algo-1", harness.command(Program.runs(on_term=None, stdout=READY))))
        task_ready(backend, "job-algo-1")
        backend.terminate(TaskRef("job-algo-1"), LONG)
        backend.terminate(TaskRef("job-algo-1"), timedelta(seconds=0.3))
        assert task_final(backend, "job-algo-1", timeout=5).state is TaskState.KILLED

    def test_terminating_a_node_ends_everything_on_it(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        backend.run(TaskSpec("t-1", harness.command(Program.runs(on_term=None, stdout=READY)), NODE))
        task_ready(backend, "t-1")
        started = time.monotonic()
        backend.terminate(NodeRef(NODE), SECOND)
        assert backend.node_status(NODE).state is NodeState.SHUTTING_DOWN
        with pytest.raises(NodeUnavailable):
            backend.run(TaskSpec("t-2", harness.command(Program.exits(0)), NODE))
        with pytest.raises(NodeUnavailable):
            backend.exec(NODE, harness.command(Program.exits(0)), SECOND)
        assert node_gone(backend).state is NodeState.TERMINATED
        assert time.monotonic() - started >= 1.0
        status = backend.task_status("t-1")
        assert (status.state, status.signal) == (TaskState.KILLED, SIGKILL)
        backend.terminate(NodeRef(NODE), SECOND)  # ended: nothing happens

    def test_a_task_terminated_before_it_started_never_starts(self, harness: Harness) -> None:
        backend = harness.backend
        backend.provision(node_spec(harness.lifecycle(Program.exits(0, after=1.0))))
        backend.run(TaskSpec("t-1", harness.command(Program.exits(0)), NODE))
        backend.terminate(TaskRef("t-1"), SECOND)
        status = task_final(backend, "t-1")
        assert (status.state, status.signal, status.exit_code) == (TaskState.KILLED, None, None)

    def test_a_signal_reaches_a_task_and_published_variables_reach_later_ones(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        backend.run(TaskSpec("t-1", harness.command(Program.runs(on_term=143, stdout=READY)), NODE))
        task_ready(backend, "t-1")
        backend.signal(NodeRef(NODE), SIGTERM, env={EXPIRATION_VARIABLE: "1767225600"})
        assert task_final(backend, "t-1").exit_code == 143
        assert backend.node_status(NODE).state is NodeState.RUNNING
        backend.run(TaskSpec("t-2", harness.command(Program.runs(echo=(EXPIRATION_VARIABLE,))), NODE))
        assert task_running(backend, "t-2").state is TaskState.RUNNING
        chunk = eventually(
            lambda: backend.read_log(TaskRef("t-2"), LogStream.STDOUT), lambda chunk: bool(chunk.data)
        )
        assert chunk.data == b"1767225600\n"
        backend.signal(TaskRef("t-2"), SIGTERM)
        assert task_final(backend, "t-2").exit_code == 143

    # --- exec ------------------------------------------------------------------------------------

    def test_exec_runs_a_command_and_returns_its_output(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        result = backend.exec(
            NODE, harness.command(Program.exits(2, stdout=b"hi\n", stderr=b"warn\n")), SECOND * 10
        )
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
            2,
            b"hi\n",
            b"warn\n",
            False,
        )
        started = time.monotonic()
        late = backend.exec(NODE, harness.command(Program.runs(on_term=None)), timedelta(seconds=0.3))
        assert late.timed_out and late.exit_code is None
        assert time.monotonic() - started < 5
        with pytest.raises(UnknownResource):
            backend.exec(OTHER_NODE, harness.command(Program.exits(0)), SECOND)
        assert not (result.stdout_truncated or result.stderr_truncated)

    def test_exec_returns_at_most_the_limit_of_each_stream_and_says_it_cut(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        chatty = harness.command(Program.exits(0, stdout=b"o" * 3000 + b"END", stderr=b"e" * 100))
        result = backend.exec(NODE, chatty, SECOND * 10, output_limit=1000)
        assert (result.stdout, result.stdout_truncated) == (b"o" * 1000, True)
        assert (result.stderr, result.stderr_truncated) == (b"e" * 100, False)
        exact = backend.exec(
            NODE, harness.command(Program.exits(0, stdout=b"x" * 1000)), SECOND * 10, output_limit=1000
        )
        assert (exact.stdout, exact.stdout_truncated) == (b"x" * 1000, False)
        default = backend.exec(NODE, harness.command(Program.exits(0, stdout=b"d" * 100)), SECOND * 10)
        assert (default.stdout, default.stdout_truncated) == (b"d" * 100, False)
        assert EXEC_OUTPUT_LIMIT == 1 << 20

    # --- restarts --------------------------------------------------------------------------------

    def test_a_new_back_end_adopts_known_work(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        backend.run(TaskSpec("long", harness.command(Program.runs(on_term=None, stdout=READY)), NODE))
        backend.run(TaskSpec("short", harness.command(Program.exits(3, after=0.8, stderr=b"bad input\n"))))
        task_ready(backend, "long")
        assert task_running(backend, "short").state is TaskState.RUNNING
        backend = harness.restart()
        assert harness.ended_unwatched("short")  # "short" ends while no server watches
        report = backend.adopt(
            [NodeRef(NODE), TaskRef("long"), TaskRef("short"), TaskRef("never-ran"), NodeRef(OTHER_NODE)]
        )
        assert set(report.running) == {NodeRef(NODE), TaskRef("long")}
        assert set(report.ended) == {TaskRef("short")}
        assert set(report.missing) == {TaskRef("never-ran"), NodeRef(OTHER_NODE)}
        assert report.killed == ()
        short = backend.task_status("short")
        assert (short.state, short.exit_code) == (TaskState.EXITED, 3) and "bad input" in short.message
        assert backend.task_status("long").state is TaskState.RUNNING
        backend.terminate(TaskRef("long"), timedelta(seconds=0.3))
        assert task_final(backend, "long").signal == SIGKILL
        assert backend.node_status(NODE).state is NodeState.RUNNING

    def test_adopt_kills_work_the_store_does_not_know(self, harness: Harness) -> None:
        self.running_node(harness)
        self.running_node(harness, OTHER_NODE)
        backend = harness.backend
        backend.run(TaskSpec("on-other", harness.command(Program.runs()), OTHER_NODE))
        backend.run(TaskSpec("stray-job", harness.command(Program.runs())))
        backend.run(TaskSpec("known-job", harness.command(Program.runs())))
        for task_id in ("on-other", "stray-job", "known-job"):
            assert task_running(backend, task_id).state is TaskState.RUNNING
        backend = harness.restart()
        report = backend.adopt([NodeRef(NODE), TaskRef("known-job")])
        assert set(report.killed) == {NodeRef(OTHER_NODE), TaskRef("on-other"), TaskRef("stray-job")}
        assert set(report.running) == {NodeRef(NODE), TaskRef("known-job")}
        for gone in (lambda: backend.node_status(OTHER_NODE), lambda: backend.task_status("stray-job")):
            with pytest.raises(UnknownResource):
                gone()
        assert backend.node_status(NODE).state is NodeState.RUNNING
        assert backend.task_status("known-job").state is TaskState.RUNNING

    # --- forgetting ------------------------------------------------------------------------------

    def test_only_ended_work_can_be_forgotten(self, harness: Harness) -> None:
        self.running_node(harness)
        backend = harness.backend
        backend.run(TaskSpec("job-algo-1", harness.command(Program.runs())))
        assert task_running(backend, "job-algo-1").state is TaskState.RUNNING
        with pytest.raises(NodeUnavailable):
            backend.forget(TaskRef("job-algo-1"))
        with pytest.raises(NodeUnavailable):
            backend.forget(NodeRef(NODE))
        backend.terminate(TaskRef("job-algo-1"), SECOND)
        backend.terminate(NodeRef(NODE), SECOND)
        assert task_final(backend, "job-algo-1").state.is_final()
        assert node_gone(backend).state is NodeState.TERMINATED
        backend.forget(TaskRef("job-algo-1"))
        backend.forget(NodeRef(NODE))
        with pytest.raises(UnknownResource):
            backend.task_status("job-algo-1")
        with pytest.raises(UnknownResource):
            backend.node_status(NODE)
        backend.provision(NodeSpec(NODE, "ip-10-1-0-9", INSTANCE_TYPE))  # the id is free again
        status = node_settled(backend)
        assert status.state is NodeState.RUNNING, status
