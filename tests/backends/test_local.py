"""The local back end: the contract with real processes, and what only real processes can show."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import (
    EXPIRATION_VARIABLE,
    Backend,
    LocalBackend,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    Program,
    TaskRef,
    TaskSpec,
    TaskState,
    procfs,
)
from hyperplan.backends.layout import (
    Layout,
    NodeFiles,
    ProcRecord,
    StateRecord,
    TaskRecord,
    TerminateOrder,
    read_record,
    write_record,
)
from tests.backends.contract import (
    INSTANCE_TYPE,
    NODE,
    OTHER_NODE,
    SECOND,
    BackendContract,
    Harness,
    eventually,
    node_gone,
    node_settled,
    task_final,
    task_ready,
    task_running,
)


def render(program: Program) -> str:
    """A POSIX sh script that does what ``program`` says. Sleeps run in the background under ``wait``
    so that a trapped SIGTERM is handled at once."""
    lines = ["trap '' TERM" if program.on_term is None else f"trap 'exit {program.on_term}' TERM"]
    for stream, data in ((1, program.stdout), (2, program.stderr)):
        if data:
            lines.append(f"printf '%s' {shlex.quote(data.decode())} >&{stream}")
    lines += [f"printf '%s\\n' \"${name}\"" for name in program.echo]
    if program.exit_code is None:
        lines.append("while :; do sleep 1 & wait $!; done")
    else:
        if program.seconds:
            lines.append(f"sleep {program.seconds} & wait $!")
        lines.append(f"exit {program.exit_code}")
    return "\n".join(lines) + "\n"


class LocalHarness(Harness):
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.root = tmp_path / "backend"
        self.backend: Backend = LocalBackend(self.root)
        self.count = 0

    def command(self, program: Program) -> tuple[str, ...]:
        return ("/bin/sh", "-c", render(program))

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        self.count += 1
        source = self.tmp_path / f"lifecycle-{self.count}"
        source.mkdir()
        (source / "on_create.sh").write_text(render(program))
        return source, "on_create.sh"

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        exit_record = self.local.layout.task(task_id).exit  # the agent writes it when the process ends
        return bool(eventually(exit_record.exists, bool, timeout))

    def restart(self) -> Backend:
        self.backend.close()
        self.backend = LocalBackend(self.root)
        return self.backend

    @property
    def local(self) -> LocalBackend:
        assert isinstance(self.backend, LocalBackend)
        return self.backend


def local_harness(tmp_path: Path) -> Iterator[LocalHarness]:
    harness = LocalHarness(tmp_path)
    yield harness
    harness.backend.close()
    # Whatever a test left running goes: a back end that knows nothing kills everything under its root.
    LocalBackend(harness.root).adopt([])


harness = pytest.fixture(local_harness, name="harness")


class TestLocalContract(BackendContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[LocalHarness]:
        yield from local_harness(tmp_path)


def layout(harness: LocalHarness) -> Layout:
    return harness.local.layout


def pid_of_task(harness: LocalHarness, task_id: str) -> ProcRecord:
    proc = read_record(layout(harness).task(task_id).proc, ProcRecord)
    assert proc is not None
    return proc


def alive(pid: int) -> bool:
    stat = procfs.read_stat(pid)
    return stat is not None and not stat.is_zombie


def dies(pid: int) -> bool:
    """Whether ``pid`` is dead within a few seconds: a killed process takes a moment to be a zombie."""
    return not eventually(lambda: alive(pid), lambda running: not running, timeout=5)


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def wait_for_file(path: Path, timeout: float = 10) -> str:
    return eventually(lambda: path.read_text() if path.exists() else "", bool, timeout)


# --- nodes ------------------------------------------------------------------------------------------


def test_on_create_runs_a_copy_of_the_lifecycle_scripts_with_the_node_environment(
    harness: LocalHarness,
) -> None:
    source = harness.tmp_path / "scripts"
    source.mkdir()
    (source / "settings.conf").write_text("fsx=/fsx\n")
    # No #! line and no execute bit, as scripts come from object storage: it runs under sh.
    (source / "on_create.sh").write_text(
        textwrap.dedent("""\
        cat settings.conf > "$HOME/created"
        echo "arg=$1 cwd=$(pwd)" >> "$HOME/created"
        echo "$HYPERPLAN_NODE_ID $HYPERPLAN_NODE_NAME $HYPERPLAN_INSTANCE_TYPE $TEAM" >> "$HOME/created"
        """)
    )
    spec = NodeSpec(
        NODE, "ip-10-1-0-1", INSTANCE_TYPE, {"TEAM": "vision"}, source, "on_create.sh", ("--controller",)
    )
    harness.backend.provision(spec)
    assert node_settled(harness.backend).state is NodeState.RUNNING
    home = layout(harness).node(NODE).home
    assert (home / "created").read_text().splitlines() == [
        "fsx=/fsx",
        f"arg=--controller cwd={home / 'lifecycle'}",
        f"{NODE} ip-10-1-0-1 {INSTANCE_TYPE} vision",
    ]


def test_an_on_create_script_that_is_a_link_is_refused_and_links_are_copied_as_links(
    harness: LocalHarness,
) -> None:
    """The agent reads and chmods the script as the server's user: a link in the tenant's scripts must
    not make it touch a file elsewhere."""
    outside = harness.tmp_path / "server-file"
    outside.write_text("#!/bin/sh\n")
    outside.chmod(0o600)
    source = harness.tmp_path / "scripts"
    source.mkdir()
    (source / "on_create.sh").symlink_to(outside)
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE, {}, source, "on_create.sh"))
    status = node_settled(harness.backend)
    assert status.state is NodeState.FAILURE and "symbolic link" in status.message, status
    assert (outside.stat().st_mode & 0o777) == 0o600  # not made executable
    assert (layout(harness).node(NODE).lifecycle_dir / "on_create.sh").is_symlink()


def test_exec_runs_in_the_node_home_with_the_node_environment(harness: LocalHarness) -> None:
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE, {"TEAM": "vision"}))
    assert node_settled(harness.backend).state is NodeState.RUNNING
    result = harness.backend.exec(
        NODE,
        ["sh", "-c", 'pwd; echo "$TEAM $EXTRA $HYPERPLAN_NODE_ID"; echo oops >&2; exit 4'],
        SECOND * 10,
        env={"EXTRA": "x"},
    )
    home = layout(harness).node(NODE).home
    assert result.stdout.decode().splitlines() == [str(home), f"vision x {NODE}"]
    assert (result.stderr, result.exit_code) == (b"oops\n", 4)
    missing = harness.backend.exec(NODE, ["no-such-program"], SECOND * 10)
    assert missing.exit_code == 127 and b"no-such-program" in missing.stderr
    assert layout(harness).task_ids() == []  # exec leaves nothing behind


def test_the_expiration_timestamp_is_readable_by_the_node_processes_at_sigterm(harness: LocalHarness) -> None:
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    assert node_settled(harness.backend).state is NodeState.RUNNING
    handler = f'echo "expires at $(cat "$HYPERPLAN_ENV_DIR/{EXPIRATION_VARIABLE}")"; exit 0'
    script = f"trap {shlex.quote(handler)} TERM; echo ready; while :; do sleep 1 & wait $!; done"
    harness.backend.run(TaskSpec("trainer", ("/bin/sh", "-c", script), NODE))
    task_ready(harness.backend, "trainer")
    harness.backend.terminate(NodeRef(NODE), SECOND * 10, env={EXPIRATION_VARIABLE: "1767225600"})
    status = task_final(harness.backend, "trainer")
    assert (status.state, status.exit_code) == (TaskState.EXITED, 0)
    assert (
        harness.backend.read_log(TaskRef("trainer"), LogStream.STDOUT).data
        == b"ready\nexpires at 1767225600\n"
    )
    assert node_gone(harness.backend).state is NodeState.TERMINATED


def test_provisioning_twice_starts_one_agent(harness: LocalHarness) -> None:
    spec = NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE)
    harness.backend.provision(spec)
    harness.backend.provision(spec)  # before the first agent has written its record: a second launch
    assert node_settled(harness.backend).state is NodeState.RUNNING
    node_dir = str(layout(harness).node(NODE).path)

    def agents() -> int:
        return sum(
            1
            for pid in procfs.snapshot()
            if b"hyperplan.backends.agent" in cmdline(pid)
            and procfs.read_environ(pid).get("HYPERPLAN_NODE_DIR") == node_dir
        )

    assert eventually(agents, lambda count: count == 1, timeout=5) == 1


# --- surviving the server ---------------------------------------------------------------------------


def test_a_terminate_completes_while_no_server_runs(harness: LocalHarness) -> None:
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    assert node_settled(harness.backend).state is NodeState.RUNNING
    script = "trap '' TERM; echo ready; while :; do sleep 1; done"
    harness.backend.run(TaskSpec("stubborn", ("/bin/sh", "-c", script), NODE))
    task_ready(harness.backend, "stubborn")
    pid = pid_of_task(harness, "stubborn").pid
    started = time.monotonic()
    harness.backend.terminate(NodeRef(NODE), SECOND)
    harness.backend.close()  # the server dies: no timers, no status calls from here on
    files = layout(harness).node(NODE)
    assert dies(pid) and time.monotonic() - started >= 1.0
    state = eventually(
        lambda: read_record(files.state, StateRecord), lambda s: s is not None and s.state == "Terminated"
    )
    assert state is not None and state.state == NodeState.TERMINATED
    backend = harness.restart()
    report = backend.adopt([NodeRef(NODE), TaskRef("stubborn")])
    assert set(report.ended) == {NodeRef(NODE), TaskRef("stubborn")}
    assert backend.task_status("stubborn").signal == signal.SIGKILL


def test_adopt_leaves_no_orphans_even_ones_that_escaped(harness: LocalHarness) -> None:
    # Each node's OnCreate leaves a daemon in a session of its own, as `setsid` daemons do.
    daemon = textwrap.dedent("""\
        setsid sleep 300 </dev/null >/dev/null 2>&1 &
        echo $! > "$HOME/daemon.pid"
        """)
    for node_id in (NODE, OTHER_NODE, "i-00000000000000003"):
        source = harness.tmp_path / f"scripts-{node_id}"
        source.mkdir()
        (source / "on_create.sh").write_text(daemon)
        harness.backend.provision(NodeSpec(node_id, node_id, INSTANCE_TYPE, {}, source, "on_create.sh"))
    pids = {}
    for node_id in (NODE, OTHER_NODE, "i-00000000000000003"):
        assert node_settled(harness.backend, node_id).state is NodeState.RUNNING
        pids[node_id] = int(wait_for_file(layout(harness).node(node_id).home / "daemon.pid"))
        assert alive(pids[node_id])
    # The third node's agent dies and its files are lost: only the variables its processes carry can find
    # them. (An agent that lives on finds its files gone and ends its node by itself.)
    lost = layout(harness).node("i-00000000000000003")
    agent = read_record(lost.agent, ProcRecord)
    assert agent is not None
    os.kill(agent.pid, signal.SIGKILL)
    assert eventually(lost.agent_exit.exists, bool)  # its parent has said how it ended: nothing writes now
    shutil.rmtree(lost.path)
    backend = harness.restart()
    report = backend.adopt([NodeRef(NODE)])
    assert report.killed == (NodeRef(OTHER_NODE),)
    assert pids["i-00000000000000003"] in report.stray_pids
    assert dies(pids[OTHER_NODE]) and dies(pids["i-00000000000000003"]) and dies(agent.pid)
    assert alive(pids[NODE])
    backend.terminate(NodeRef(NODE), SECOND)
    assert node_gone(backend).state is NodeState.TERMINATED
    assert dies(pids[NODE])  # terminating a node reaches its escaped daemon too


def test_a_dead_agent_fails_its_node_and_loses_its_tasks(harness: LocalHarness) -> None:
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    assert node_settled(harness.backend).state is NodeState.RUNNING
    harness.backend.run(TaskSpec("t-1", ("sleep", "300"), NODE))
    assert task_running(harness.backend, "t-1").state is TaskState.RUNNING
    task_pid = pid_of_task(harness, "t-1").pid
    agent = read_record(layout(harness).node(NODE).agent, ProcRecord)
    assert agent is not None
    os.kill(agent.pid, signal.SIGKILL)
    status = eventually(lambda: harness.backend.node_status(NODE), lambda s: s.state is NodeState.FAILURE)
    # How it ended comes from its parent, which waited for it; a SIGKILL leaves the agent nothing to say.
    said = "the node agent died (killed by SIGKILL, signal 9) and said nothing"
    assert (status.state, status.message, status.died) == (NodeState.FAILURE, said, True)
    assert harness.backend.task_status("t-1").state is TaskState.LOST
    assert dies(task_pid)
    harness.backend.terminate(NodeRef(NODE), SECOND)
    assert harness.backend.node_status(NODE).state is NodeState.TERMINATED


def test_a_backstop_that_finds_its_node_forgotten_midway_leaves_the_rest_to_the_forgetting(
    harness: LocalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop (a timer's thread) kills a node whose agent missed its terminate order's deadline,
    then records how it ended. A `forget` on another thread may remove the node's files in between:
    the record then has no directory to go into. Seen in CI as a FileNotFoundError traceback in a
    server's log; now the backstop leaves it to the forgetting, which kills and removes everything."""
    local = harness.local
    local.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    assert node_settled(local).state is NodeState.RUNNING
    files = layout(harness).node(NODE)
    agent = read_record(files.agent, ProcRecord)
    assert agent is not None
    os.kill(agent.pid, signal.SIGSTOP)  # an agent that misses its deadline (and does not see the order)
    deadline = time.monotonic()
    write_record(files.terminate, TerminateOrder(0.0, deadline))
    record_death = local._record_death
    recorded: list[str] = []

    def forgotten_first(node: NodeFiles, why: str, died: bool) -> None:
        shutil.rmtree(node.path)  # what `forget` does, on the server's thread
        recorded.append(why)
        record_death(node, why, died)

    monkeypatch.setattr(local, "_record_death", forgotten_first)
    local._backstop(NodeRef(NODE), deadline)
    assert recorded, "the backstop settled the node (the race this test is about)"
    assert dies(agent.pid)
    assert not files.path.exists()


def test_a_dead_agent_s_node_failure_quotes_what_the_agent_said_last(harness: LocalHarness) -> None:
    harness.backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE))
    assert node_settled(harness.backend).state is NodeState.RUNNING
    # Its queue made a file: each of the agent's steps fails, and it says so on its error output.
    files = layout(harness).node(NODE)
    shutil.rmtree(files.queue)
    files.queue.write_text("")
    assert eventually(lambda: files.agent_log.read_text(), lambda said: "NotADirectoryError" in said)
    files.queue.unlink()
    files.queue.mkdir()
    agent = read_record(files.agent, ProcRecord)
    assert agent is not None
    os.kill(agent.pid, signal.SIGKILL)
    status = eventually(lambda: harness.backend.node_status(NODE), lambda s: s.state is NodeState.FAILURE)
    assert status.message.startswith("the node agent died (killed by SIGKILL, signal 9); its last words: ")
    assert status.message.endswith(
        "NotADirectoryError: [Errno 20] Not a directory: " + repr(str(files.queue))
    )
    assert status.died
    # A node that failed on its own is told apart from one whose provisioning failed.
    harness.backend.provision(NodeSpec(OTHER_NODE, "ip-10-1-0-2", INSTANCE_TYPE, {}, *harness.lifecycle(
        Program.exits(3, stderr=b"cannot mount /fsx\n")
    )))  # fmt: skip
    assert not node_settled(harness.backend, OTHER_NODE).died


# --- jobs -------------------------------------------------------------------------------------------

SERVER = """
import os, socket
listener = socket.create_server(("127.0.0.1", 0))
port_file = os.path.join(os.environ["RENDEZVOUS"], "port")
with open(port_file + ".tmp", "w") as out:
    out.write(str(listener.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)
connection, _ = listener.accept()
print("pong:" + connection.recv(100).decode(), flush=True)
connection.sendall(b"pong")
"""

CLIENT = """
import os, socket, time
port_file = os.path.join(os.environ["RENDEZVOUS"], "port")
while not os.path.exists(port_file):
    time.sleep(0.02)
with socket.create_connection(("127.0.0.1", int(open(port_file).read())), timeout=10) as connection:
    connection.sendall(os.environ["HYPERPLAN_TASK_ID"].encode())
    print(connection.recv(100).decode(), flush=True)
"""


def test_two_instances_of_a_job_reach_each_other_over_loopback(harness: LocalHarness) -> None:
    rendezvous = harness.tmp_path / "rendezvous"
    rendezvous.mkdir()
    env = {"RENDEZVOUS": str(rendezvous)}
    harness.backend.run(TaskSpec("job-algo-1", (sys.executable, "-c", SERVER), env=env))
    harness.backend.run(TaskSpec("job-algo-2", (sys.executable, "-c", CLIENT), env=env))
    for task_id in ("job-algo-1", "job-algo-2"):
        status = task_final(harness.backend, task_id, timeout=15)
        assert (status.state, status.exit_code) == (TaskState.EXITED, 0), status.message
    read = harness.backend.read_log
    assert read(TaskRef("job-algo-1"), LogStream.STDOUT).data == b"pong:job-algo-2\n"
    assert read(TaskRef("job-algo-2"), LogStream.STDOUT).data == b"pong\n"


def test_a_sandbox_ends_with_its_task_and_takes_its_leftovers(harness: LocalHarness) -> None:
    script = 'sleep 300 & echo $! > "$HOME/left.pid"; exit 0'
    harness.backend.run(TaskSpec("job-algo-1", ("/bin/sh", "-c", script)))
    assert task_final(harness.backend, "job-algo-1").exit_code == 0
    sandbox = layout(harness).task("job-algo-1").sandbox
    leftover = int(wait_for_file(sandbox / "home" / "left.pid"))
    assert dies(leftover)
    state = eventually(
        lambda: read_record(sandbox / "state.json", StateRecord),
        lambda s: s is not None and s.state == "Terminated",
    )
    assert state is not None


# --- /proc --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "4242 (sleep) S 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 987654 5750784 200",
            procfs.ProcStat(4242, "S", 1, 4242, 4242, 987654),
        ),
        (
            "77 (a (weird) name) Z 76 70 60 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 123 0 0",
            procfs.ProcStat(77, "Z", 76, 70, 60, 123),
        ),
    ],
)
def test_parse_stat(line: str, expected: procfs.ProcStat) -> None:
    assert procfs.parse_stat(line) == expected


def test_parse_environ() -> None:
    assert procfs.parse_environ(b"A=1\0B=x=y\0EMPTY=\0junk\0") == {"A": "1", "B": "x=y", "EMPTY": ""}


def test_members_finds_a_session_its_descendants_and_nothing_else() -> None:
    procs = {
        stat.pid: stat
        for stat in (
            procfs.ProcStat(10, "S", 1, 10, 10, 0),  # the agent
            procfs.ProcStat(11, "S", 10, 11, 10, 0),  # a task
            procfs.ProcStat(12, "S", 11, 12, 12, 0),  # left the session, still a descendant
            procfs.ProcStat(13, "S", 1, 13, 10, 0),  # re-parented to init, still in the session
            procfs.ProcStat(20, "S", 1, 20, 20, 0),  # someone else
        )
    }
    assert procfs.members(procs, 10) == {11, 12, 13}


def test_a_run_cut_short_by_a_crash_is_missing_and_can_be_run_again(harness: LocalHarness) -> None:
    spec = TaskSpec("job-algo-1", ("/bin/sh", "-c", "echo trained"))
    # The server wrote the task's spec and died before it made the sandbox.
    record = TaskRecord(spec.task_id, None, list(spec.argv), {}, None)
    harness.local._write_task(layout(harness).task(spec.task_id), record)
    backend = harness.restart()
    assert backend.adopt([TaskRef("job-algo-1")]).missing == (TaskRef("job-algo-1"),)
    assert backend.task_status("job-algo-1").state is TaskState.PENDING
    backend.run(spec)
    assert task_final(backend, "job-algo-1").exit_code == 0
    assert backend.read_log(TaskRef("job-algo-1"), LogStream.STDOUT).data == b"trained\n"
