"""The fake back end: the contract in memory, and the handles a service test drives it with."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from signal import SIGKILL, SIGTERM

import pytest

from hyperplan.backends import (
    EXPIRATION_VARIABLE,
    Backend,
    FakeBackend,
    FakeWorld,
    NodeRef,
    NodeSpec,
    NodeState,
    NodeStatus,
    NodeUnavailable,
    Program,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from tests.backends.contract import INSTANCE_TYPE, NODE, BackendContract, Harness, eventually


class FakeHarness(Harness):
    def __init__(self) -> None:
        self.world = FakeWorld()
        self.backend: Backend = FakeBackend(self.world)

    def command(self, program: Program) -> tuple[str, ...]:
        return self.world.command(program)

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        return self.world.lifecycle(program)

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        def ended() -> bool:
            with self.world.lock:
                return self.world.tasks[task_id].status(self.world.clock()).state.is_final()

        return bool(eventually(ended, bool, timeout))

    def restart(self) -> Backend:
        self.backend.close()
        self.backend = FakeBackend(self.world)
        return self.backend


class TestFakeContract(BackendContract):
    @pytest.fixture
    def harness(self) -> FakeHarness:
        return FakeHarness()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> FakeBackend:
    return FakeBackend(FakeWorld(clock), on_create=Program.runs())


def test_a_test_drives_provisioning(fake: FakeBackend) -> None:
    source = Path("/lifecycle")
    fake.provision(
        NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE, lifecycle_source=source, on_create="on_create.sh")
    )
    fake.provision(
        NodeSpec("i-2", "ip-10-1-0-2", INSTANCE_TYPE, lifecycle_source=source, on_create="on_create.sh")
    )
    assert fake.node_status(NODE).state is NodeState.PENDING
    fake.finish_provision(NODE)
    fake.fail_provision("i-2", "no space left on /fsx")
    assert fake.node_status(NODE) == NodeStatus(NodeState.RUNNING)
    assert fake.node_status("i-2") == NodeStatus(NodeState.FAILURE, "no space left on /fsx")


def test_a_test_completes_tasks_and_loses_nodes(fake: FakeBackend) -> None:
    fake.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    fake.run(TaskSpec("t-1", ("train",), NODE))
    fake.run(TaskSpec("t-2", ("train",), NODE))
    assert fake.task_status("t-1").state is TaskState.RUNNING
    fake.complete("t-1", 2, stderr=b"diverged\n")
    assert fake.task_status("t-1") == TaskStatus(TaskState.EXITED, exit_code=2, message="diverged")
    with pytest.raises(NodeUnavailable):
        fake.complete("t-1")
    fake.lose_node(NODE, "host rebooted")
    assert fake.node_status(NODE) == NodeStatus(NodeState.FAILURE, "host rebooted", died=True)
    assert fake.task_status("t-2").state is TaskState.LOST


def test_grace_follows_the_world_clock(fake: FakeBackend, clock: Clock) -> None:
    fake.run(TaskSpec("job-algo-1", fake.world.command(Program.runs(on_term=None))))
    fake.terminate(TaskRef("job-algo-1"), timedelta(seconds=120), env={EXPIRATION_VARIABLE: "1767225600"})
    assert fake.signals_of("job-algo-1") == [SIGTERM]
    assert fake.published_env(TaskRef("job-algo-1")) == {EXPIRATION_VARIABLE: "1767225600"}
    clock.now += 119
    assert fake.task_status("job-algo-1").state is TaskState.RUNNING
    clock.now += 1
    assert fake.task_status("job-algo-1") == TaskStatus(TaskState.KILLED, signal=SIGKILL)


def test_exec_is_recorded_with_its_environment(fake: FakeBackend) -> None:
    fake.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE, {"TEAM": "vision"}))
    fake.signal(NodeRef(NODE), SIGTERM, env={EXPIRATION_VARIABLE: "1"})
    result = fake.exec(NODE, ["hostname"], timedelta(seconds=5))
    assert result.exit_code == 0
    assert fake.world.execs == [(NODE, ("hostname",), {"TEAM": "vision", EXPIRATION_VARIABLE: "1"})]


def test_the_public_surface() -> None:
    import hyperplan.backends

    assert set(hyperplan.backends.__all__) == {
        *("Backend", "LocalBackend", "FakeBackend", "FakeWorld", "Program"),
        *("NodeSpec", "TaskSpec", "NodeRef", "TaskRef", "Ref"),
        *("NodeState", "NodeStatus", "TaskState", "TaskStatus", "LogStream", "LogChunk", "ExecResult"),
        *("TimedLine", "TimedLines", "Placement"),
        *("AdoptReport", "BackendError", "UnknownResource", "SpecConflict", "NodeUnavailable"),
        *("EXPIRATION_VARIABLE", "ENV_DIR_VARIABLE", "EXEC_OUTPUT_LIMIT"),
    }
    assert all(hasattr(hyperplan.backends, name) for name in hyperplan.backends.__all__)
