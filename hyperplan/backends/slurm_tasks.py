"""The Slurm back end's tasks: a job step on a node, or a sandbox's (a group's) batch job of its own.

A task moves on at each look (``advance``): its step launched once its node runs, its job submitted (a
group's once every member is there). How its program ended comes from what the tenant cannot write
where that exists (a step's srun exit status, a sandbox's Slurm ExitCode, the server's ``killed``
mark), else from what the runner wrote, checked (``runner_records.py``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from signal import SIGKILL, SIGTERM
from typing import Any

from hyperplan.backends import slurm_containers, slurm_memory, tenant_files
from hyperplan.backends.base import (
    BackendError,
    Mount,
    NodeState,
    NodeUnavailable,
    Placement,
    RunAs,
    SpecConflict,
    TaskSpec,
    TaskState,
    TaskStatus,
    check_id,
)
from hyperplan.backends.layout import (
    PASSAGE_MODE,
    READABLE_DIR_MODE,
    READABLE_FILE_MODE,
    hand_over,
    make_dir,
    placement_record,
    run_as_record,
    tail,
    write_atomically,
)
from hyperplan.backends.runner_records import RunnerExit, witnessed
from hyperplan.backends.slurm_images import SlurmImages
from hyperplan.backends.slurm_nodes import NodeJobs
from hyperplan.backends.slurm_queue import LIVE_JOB_STATES, SlurmQueue
from hyperplan.backends.slurm_records import (
    KILLED,
    RECORD_LIMIT,
    SlurmDirs,
    end_task,
    grouped,
    job_id_of,
    nonce,
    placement_from,
    read_json,
    run_as_from,
    runner_exit,
    status_of,
    write_json,
)
from hyperplan.backends.slurm_submit import (
    SUBMIT_RETRY_SECONDS,
    Submitter,
    base_env,
    check_run_as,
    not_yet,
    write_runner_spec,
)
from hyperplan.slurm.client import SlurmError
from hyperplan.slurm.parse import Job

log = logging.getLogger(__name__)

SRUN_EXIT_WAIT = 1.0
"""How long one look waits (holding the back end's lock) for a node task's srun to exit once Slurm says
its step has ended."""
SRUN_EXIT_PATIENCE = 60.0
"""How long the looks wait in all for that srun (a loaded host may take it more than one look): until
then the task is still ending; after, its end is taken from its runner's record, as without srun."""
STEP_START_SECONDS = 60.0
"""A step's srun that has gone without its runner ever starting: Lost after this long."""
STEP_REFUSED = "Unable to create step"
"""What srun says (in ``srun.log``) when Slurm did not create its step: none ran, so another try is safe."""


def task_record(spec: TaskSpec) -> dict[str, Any]:
    """What ``task.json`` holds of a spec: a second run with the same id must match it."""
    record = {
        "task_id": spec.task_id,
        "node_id": spec.node_id,
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "cwd": str(spec.cwd) if spec.cwd else None,
        "run_as": run_as_record(spec.run_as),
        "placement": placement_record(spec.placement),
    }
    container = slurm_containers.record(spec.container)
    if container is not None:  # (a record without one reads as before containers)
        record["container"] = container
    return record


class TaskJobs:
    """The tasks under ``dirs.tasks`` as Slurm steps and jobs (callers hold the back end's lock)."""

    def __init__(
        self,
        dirs: SlurmDirs,
        queue: SlurmQueue,
        submitter: Submitter,
        nodes: NodeJobs,
        images: SlurmImages | None = None,
    ) -> None:
        self.dirs = dirs
        self.queue = queue
        self.submitter = submitter
        self.nodes = nodes
        self.images = images  # where containers' images are unpacked; None: this back end runs none
        self._launches: dict[str, subprocess.Popen[bytes]] = {}
        self._step_gone: dict[str, float] = {}  # task -> when a look first found its step gone, srun not

    # --- starting --------------------------------------------------------------------------------

    def run(self, spec: TaskSpec, record: Mapping[str, Any]) -> None:
        directory = self.dirs.tasks / spec.task_id
        existing = read_json(directory / "task.json")
        if existing is not None:
            if {k: existing.get(k) for k in record} != record:
                raise SpecConflict(f"task {spec.task_id} exists with another spec")
            self.advance(directory, existing)
            return
        if spec.node_id is None:
            check_run_as(spec.run_as)
            self._new_sandbox_task(directory, spec, record)
            return
        node_dir = self.dirs.node_dir(spec.node_id)
        node = read_json(node_dir / "node.json") or {}
        if spec.run_as is not None and run_as_from(node) != spec.run_as:
            raise BackendError(f"task {spec.task_id}: a task on a node runs as the node's user")
        state = self.nodes.status(node_dir).state
        if state not in (NodeState.PENDING, NodeState.RUNNING):
            raise NodeUnavailable(f"node {spec.node_id} is {state}: it takes no new tasks")
        run_as = run_as_from(node)
        make_dir(directory, PASSAGE_MODE)
        if node.get("container") is not None:
            self._describe_node_task(directory, spec, node, node_dir)
        else:
            home = node_dir / "home"
            env = {**base_env(home, run_as, node_dir), **node.get("env", {}), **dict(spec.env)}
            env["HYPERPLAN_TASK_ID"] = spec.task_id
            cwd = spec.cwd or home
            write_runner_spec(directory, list(spec.argv), env, cwd, run_as, node_dir / "env")
        write_json(directory / "task.json", {**record, "created_at": time.time(), "nonce": nonce()})
        self.advance(directory, record)

    def _describe_node_task(
        self, directory: Path, spec: TaskSpec, node: Mapping[str, Any], node_dir: Path
    ) -> None:
        """A task on a node of containers: a container of the node's image with the node's directories."""
        run_as = run_as_from(node)
        assert run_as is not None  # (checked as the node was provisioned)
        env = slurm_containers.inside_env({**node.get("env", {}), **dict(spec.env)}, spec.task_id)
        cwd = str(spec.cwd or slurm_containers.HOME_INSIDE)
        own = [Mount(node_dir / name, target) for name, target in slurm_containers.NODE_DIRS.items()]
        program = (spec.argv, env, cwd)
        slurm_containers.lay_out(
            directory, node["container"], run_as, program, node["name"], own, node_dir / "env", spec.task_id
        )

    def _new_sandbox_task(self, directory: Path, spec: TaskSpec, record: Mapping[str, Any]) -> None:
        make_dir(directory, PASSAGE_MODE)
        make_dir(directory / "env", READABLE_DIR_MODE)
        home = directory / "home"
        make_dir(home, 0o700)
        if spec.run_as is not None:
            hand_over(home, spec.run_as)
        if spec.container is not None:
            self._describe_instance(directory, spec, record)
        else:
            env = {**base_env(home, spec.run_as, directory), **dict(spec.env)}
            env["HYPERPLAN_TASK_ID"] = spec.task_id
            cwd = spec.cwd or home
            write_runner_spec(directory, list(spec.argv), env, cwd, spec.run_as, directory / "env")
        write_atomically(
            directory / "task.sh", self.submitter.sandbox_script(directory).encode(), READABLE_FILE_MODE
        )
        write_json(directory / "task.json", {**record, "created_at": time.time(), "nonce": nonce()})
        self.advance(directory, read_json(directory / "task.json") or record)

    def _describe_instance(self, directory: Path, spec: TaskSpec, record: Mapping[str, Any]) -> None:
        """A job's instance in its image: its own home and scratch, the binds its spec names (``/opt/ml``),
        named after its place among the job's hosts; its image unpacked meanwhile."""
        assert spec.container is not None
        if spec.run_as is None or self.images is None:
            raise BackendError(
                f"task {spec.task_id}: containers on Slurm run as the account's user, from a back end "
                "with a Podman store (runtime podman)"
            )
        own = slurm_containers.own_dirs(directory, slurm_containers.TASK_DIRS, spec.run_as)
        env = slurm_containers.inside_env(spec.env, spec.task_id)
        cwd = str(spec.cwd or slurm_containers.HOME_INSIDE)
        index = spec.placement.group_index if spec.placement is not None else 0
        hosts = spec.container.hosts
        hostname = hosts[index] if index < len(hosts) else f"algo-{index + 1}"
        program = (spec.argv, env, cwd)
        slurm_containers.lay_out(
            directory, record["container"], spec.run_as, program, hostname, own, directory / "env",
            spec.task_id, hosts=True,
        )  # fmt: skip
        self.images.prepare(spec.container.image, None, spec.container.insecure_registry)

    def _image_ready(self, directory: Path) -> bool:
        """Whether a task's container (if it has one) may start: its template written once its image is
        unpacked. A task whose image cannot be had is ended (Lost), saying why."""
        if self.images is None:
            return True
        found = slurm_containers.ready(directory, self.images)
        if isinstance(found, str):
            end_task(directory, TaskState.LOST, message=f"its container cannot be made: {found}")
            return False
        return found

    def advance(self, directory: Path, record: Mapping[str, Any]) -> None:
        """Move a task on as far as it can go now: launch its step once its node runs, submit its job
        (or its group's, once every member is there)."""
        if (directory / "state.json").exists() or (directory / "terminate.json").exists():
            return
        if record.get("node_id") is None:
            placement = placement_from(record.get("placement"))
            if placement is not None and placement.group is not None and placement.group_size > 1:
                self._advance_group(directory, record, placement)
                return
            if job_id_of(directory) is None and self._image_ready(directory):
                name = f"{self.queue.prefix}t.{record['task_id']}.{record.get('nonce', '')}"
                options = self.submitter.batch_options(name, 1, directory, placement)
                self._submit(directory, directory / "task.sh", options, run_as_from(record), record)
            return
        if (directory / "launch.json").exists():
            return
        node_dir = self.dirs.node_dir(record["node_id"])
        state = self.nodes.status(node_dir)
        if state.state is NodeState.RUNNING:
            self._launch_step(directory, node_dir)

    def _submit(
        self,
        directory: Path,
        script: Path,
        options: Sequence[str],
        run_as: RunAs | None,
        record: Mapping[str, Any],
    ) -> None:
        found = self.queue.job_named(options[0].split("=", 1)[1])
        if found is not None:
            write_json(directory / "job.json", {"job_id": found.id})
            return
        try:
            job_id = self.submitter.sbatch(script, options, run_as)
        except SlurmError as error:
            created = float(record.get("created_at", time.time()))
            if not_yet(error) and time.time() - created < SUBMIT_RETRY_SECONDS:
                return
            end_task(directory, TaskState.LOST, message=f"Slurm refused the job: {error.detail}")
            return
        write_json(directory / "job.json", {"job_id": job_id})
        self.queue.forget()

    def _advance_group(self, directory: Path, record: Mapping[str, Any], placement: Placement) -> None:
        assert placement.group is not None
        group = self.dirs.groups / placement.group
        make_dir(group, PASSAGE_MODE)
        make_dir(group / "members", 0o700)
        member = group / "members" / str(placement.group_index)
        if not member.exists():
            member.write_text(record["task_id"])
        if job_id_of(group) is not None:
            if not (directory / "job.json").exists():
                write_json(directory / "job.json", {"job_id": job_id_of(group), "group": placement.group})
            return
        members = {}
        for index in range(placement.group_size):
            path = group / "members" / str(index)
            if not path.exists():
                return  # the others are not there yet
            members[index] = path.read_text()
        task_dirs = [str(self.dirs.tasks / members[i]) for i in range(placement.group_size)]
        if not all([self._image_ready(Path(task_dir)) for task_dir in task_dirs]):
            for task_dir in task_dirs:  # one that cannot be made ends the group's others with it
                lost = read_json(Path(task_dir) / "state.json")
                if lost is not None:
                    for other in task_dirs:
                        end_task(Path(other), TaskState.LOST, message=lost.get("message", ""))
                    break
            return
        write_json(group / "group.json", {"members": task_dirs}, READABLE_FILE_MODE)
        script = self.submitter.group_script(directory, group, placement.group_size)
        write_atomically(group / "group.sh", script.encode(), READABLE_FILE_MODE)
        name = f"{self.queue.prefix}g.{placement.group}"
        options = self.submitter.batch_options(name, placement.group_size, directory, placement)
        self._submit(group, group / "group.sh", options, run_as_from(record), record)
        job_id = job_id_of(group)
        if job_id is None:
            state = read_json(group / "state.json")
            if state is not None:
                for task_dir in task_dirs:
                    end_task(Path(task_dir), TaskState(state["state"]), message=state.get("message", ""))
            return
        for task_dir in task_dirs:
            write_json(Path(task_dir) / "job.json", {"job_id": job_id, "group": placement.group})

    def _launch_step(self, directory: Path, node_dir: Path) -> None:
        job_id = job_id_of(node_dir)
        node = read_json(node_dir / "node.json") or {}
        record = read_json(directory / "task.json") or {}
        if job_id is None or not self._image_ready(directory):
            return
        command = self.submitter.srun_command(
            job_id, run_as_from(node), self.queue.step_name(record), directory
        )
        earlier = read_json(directory / "launch.json") or {}
        with open(directory / "srun.log", "ab") as srun_log:
            log_from = srun_log.tell()  # where this srun's words start (an earlier try's are above)
            process = self.submitter.start_srun(command, srun_log)
        self._launches[directory.name] = process
        now = time.time()
        launch = {"pid": process.pid, "job_id": job_id, "at": now, "first_at": earlier.get("first_at", now)}
        write_json(
            directory / "launch.json", {**launch, "log_from": log_from, "tries": earlier.get("tries", 0) + 1}
        )
        # Reaped here while the server lives; srun's exit status is the step's (below, _srun_exit).
        threading.Thread(target=_reap, args=(process, directory / "srun.json"), daemon=True).start()

    # --- status ----------------------------------------------------------------------------------

    def status(self, directory: Path) -> TaskStatus:
        settled = read_json(directory / "state.json")
        if settled is not None:
            return status_of(settled, directory)
        record = read_json(directory / "task.json") or {}
        self.advance(directory, record)
        settled = read_json(directory / "state.json")
        if settled is not None:
            return status_of(settled, directory)
        # Slurm's record says whether the work still runs; the runner's records (the user's to rewrite)
        # are read only once it has ended, and then only for how the program ended.
        out = directory / "out"
        started = tenant_files.exists(out / "started.json")
        terminate = read_json(directory / "terminate.json")
        job: Job | None = None
        if record.get("node_id") is not None:
            launch = read_json(directory / "launch.json")
            if launch is None:
                node_state = self.nodes.status(self.dirs.node_dir(record["node_id"])).state
                if terminate is not None or node_state not in (NodeState.PENDING, NodeState.RUNNING):
                    why = "stopped before it started" if terminate else f"stopped: its node is {node_state}"
                    return end_task(directory, TaskState.KILLED, message=why)
                return TaskStatus(TaskState.PENDING)
            step = self.queue.task_step(record, launch)
            if step is not None and terminate is not None:
                self._enforce(directory, step, terminate)  # ordered before the step had started
            # A runner that has started ran in a step Slurm lists while it lives; before that, the
            # step may still be coming (its srun trying).
            if step is not None or (not started and self._srun_alive(directory, launch)):
                return TaskStatus(TaskState.RUNNING if started and step else TaskState.PENDING)
            if not started and terminate is None:
                retried = self._retry_refused_step(directory, record, launch)
                if retried is not None:
                    return retried
            node_dir = self.dirs.nodes / record["node_id"]
            if terminate is None and (node_dir / "terminate.json").exists():
                terminate = read_json(node_dir / "terminate.json")  # ended with its node
            # srun's status is the step's only while the node's job runs on: when the job ends
            # (terminated, NODE_FAIL, its time limit) srun gives up on the step and may exit 0.
            witness = None
            if started and not tenant_files.exists(directory / KILLED) and self._job_runs(node_dir):
                witness = self._srun_exit(directory)
                if witness is None and self._srun_still_ending(directory):
                    return TaskStatus(TaskState.RUNNING)  # its word comes: not the tenant's record yet
            if witness is not None:
                ended = runner_exit(out / "exit.json")
                memory = slurm_memory.step_out_of_memory(_srun_words(directory, launch))
                return _end_witnessed(directory, ended, witness, "srun's exit status", memory)
        else:
            job_id = job_id_of(directory)
            if job_id is None:
                if terminate is not None:
                    return end_task(directory, TaskState.KILLED, message="stopped before it started")
                return TaskStatus(TaskState.PENDING)
            job = self.queue.job(job_id)
            if job is not None and job.state in LIVE_JOB_STATES:
                ended = runner_exit(out / "exit.json")
                if not grouped(record) or ended is None:
                    return TaskStatus(TaskState.RUNNING if started else TaskState.PENDING)
                if slurm_memory.awaiting_word(directory, ended, self._out_of_memory(job, record)):
                    return TaskStatus(TaskState.RUNNING)  # SIGKILLed: was it its memory? (just below)
                # A group's member may end before the others (its node's runner is done while the job
                # runs on): its record is taken, and once every member has ended so must the job, so
                # that members claiming an end they have not reached cannot keep it running unseen.
                status = self._end_from_record(directory, ended, job, record)
                self._end_group_if_over(record, job_id)
                return status
        return self._end_from_record(
            directory, runner_exit(out / "exit.json"), job, record, terminate, started
        )

    def _end_from_record(
        self,
        directory: Path,
        ended: RunnerExit | str | None,
        job: Job | None,
        record: Mapping[str, Any],
        terminate: Mapping[str, Any] | None = None,
        started: bool = False,
    ) -> TaskStatus:
        """A task whose step or job has ended (or a group's member whose runner has said so): how."""
        if tenant_files.exists(directory / KILLED):  # it still ran when the server killed it
            return end_task(directory, TaskState.KILLED, signal=SIGKILL)
        witness = _batch_exit(job, record)
        if witness is not None:
            return _end_witnessed(directory, ended, witness, "its Slurm job's ExitCode")
        memory = self._out_of_memory(job, record)
        if memory and not isinstance(ended, RunnerExit):  # no record to take: the kernel's SIGKILL
            why = f"it ended, but {ended}" if isinstance(ended, str) else ""
            return end_task(directory, TaskState.KILLED, signal=SIGKILL, message=why, out_of_memory=True)
        if isinstance(ended, str):
            return end_task(directory, TaskState.LOST, message=f"it ended, but {ended}")
        if ended is not None:
            return _end_from_runner(directory, ended, memory)
        if terminate is not None:
            return end_task(directory, TaskState.KILLED, signal=SIGKILL if started else None)
        why = _why_lost(directory, self.queue.job(job_id_of(directory) or 0))
        return end_task(directory, TaskState.LOST, message=why)

    def _out_of_memory(self, job: Job | None, record: Mapping[str, Any]) -> bool:
        """Slurm says memory killed a process of a sandbox's or group member's program
        (``slurm_memory``); node tasks are told by their srun (``status``)."""
        if record.get("node_id") is not None:
            return False
        placement = placement_from(record.get("placement"))
        if placement is not None and placement.group is not None and placement.group_size > 1:
            group = self.dirs.groups / placement.group
            return slurm_memory.member_out_of_memory(group, job, placement.group_index)
        return slurm_memory.sandbox_out_of_memory(job)

    def _retry_refused_step(
        self, directory: Path, record: Mapping[str, Any], launch: Mapping[str, Any]
    ) -> TaskStatus | None:
        """A node task whose srun has ended saying that Slurm did not create its step (see
        ``STEP_TRY_SECONDS``): launched again while its node's job runs, for up to ``STEP_START_SECONDS``
        after the first try; then Lost with srun's words. None when srun did not say so."""
        said = _srun_words(directory, launch)
        if STEP_REFUSED not in said or self._srun_exit(directory) is None:
            return None
        node_dir = self.dirs.nodes / record["node_id"]
        if not self._job_runs(node_dir):
            return None  # the node's job has ended: the task ends with it
        if time.time() - float(launch.get("first_at", launch.get("at", 0))) >= STEP_START_SECONDS:
            why = f"Slurm did not start its step within {STEP_START_SECONDS:g} s: {said.strip()}"
            return end_task(directory, TaskState.LOST, message=why)
        log.info("step of task %s refused (%s): launched again", directory.name, said.strip())
        self._launch_step(directory, node_dir)
        return TaskStatus(TaskState.PENDING)

    def _job_runs(self, node_dir: Path) -> bool:
        job_id = job_id_of(node_dir)
        job = self.queue.job(job_id) if job_id is not None else None
        return job is not None and job.state == "RUNNING"

    def _srun_exit(self, directory: Path) -> int | None:
        """A node task's srun's exit status, which is its step's (the runner's exit code, or 128 + the
        signal that ended it): srun runs on the server's machine, where the tenant's programs do not, and
        it is the server's child. Known only to the server that launched it (or from ``srun.json``,
        which the server wrote when it reaped srun); None otherwise, or while srun has not ended."""
        process = self._launches.get(directory.name)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SRUN_EXIT_WAIT)  # the step has ended: srun follows at once
            code = process.returncode
        else:
            reaped = read_json(directory / "srun.json") or {}
            launched = (read_json(directory / "launch.json") or {}).get("pid")
            # (an earlier try's srun, relaunched after a refusal, has a record of its own pid)
            code = reaped.get("returncode") if reaped.get("pid", launched) == launched else None
        if not isinstance(code, int) or not 0 <= code <= 255:
            return None  # not known, or runuser itself was killed (no step status then)
        return code

    def _srun_still_ending(self, directory: Path) -> bool:
        """The server's own srun of a task whose step has ended has not exited yet (it follows its step's
        end at once, but a loaded host can delay it past a look's wait), and has not kept the looks
        waiting SRUN_EXIT_PATIENCE seconds since one first found it so."""
        process = self._launches.get(directory.name)
        if process is None or process.poll() is not None:
            self._step_gone.pop(directory.name, None)
            return False
        since = self._step_gone.setdefault(directory.name, time.monotonic())
        return time.monotonic() - since < SRUN_EXIT_PATIENCE

    def _srun_alive(self, directory: Path, launch: Mapping[str, Any]) -> bool:
        """A launched step whose runner has not started yet: its srun still trying, for a while."""
        process = self._launches.get(directory.name)
        if process is not None:
            return process.poll() is None
        return time.time() - float(launch.get("at", 0)) < STEP_START_SECONDS

    def _end_group_if_over(self, record: Mapping[str, Any], job_id: int) -> None:
        placement = placement_from(record.get("placement"))
        group = read_json(self.dirs.groups / str(placement.group if placement else "") / "group.json") or {}
        members = [Path(str(member)) for member in group.get("members", [])]
        if members and all(tenant_files.exists(member / "state.json") for member in members):
            self.queue.cancel(str(job_id))

    def _enforce(self, directory: Path, step: str, order: Mapping[str, Any]) -> None:
        if not (directory / "signalled").exists():
            (directory / "signalled").touch()
            self.queue.cancel(step, SIGTERM)
        if float(order["deadline"]) <= time.time():
            (directory / KILLED).touch()
            self.queue.cancel(step, SIGKILL)

    # --- killing ---------------------------------------------------------------------------------

    def kill_job(self, job_id: int) -> None:
        """SIGKILL to all of a job (a node's, a sandbox's, a group's), its node tasks marked killed."""
        self.queue.kill_job(job_id, self.mark_killed)

    def mark_killed(self, task_id: str) -> None:
        """A node task's step that still ran when the server killed it."""
        with contextlib.suppress(OSError, ValueError):
            directory = self.dirs.tasks / check_id("task id", task_id)
            if (directory / "task.json").exists() and not (directory / "state.json").exists():
                (directory / KILLED).touch()

    def destroy(self, directory: Path) -> None:
        """A task's work killed and its directory removed (one the store does not know, or forgets)."""
        record = read_json(directory / "task.json") or {}
        if record.get("node_id") is not None:
            step = self.queue.task_step(record, read_json(directory / "launch.json"))
            if step is not None:
                self.queue.cancel(step, SIGKILL)
        else:
            job_id = job_id_of(directory)
            if job_id is not None:
                self.kill_job(job_id)
        shutil.rmtree(directory, ignore_errors=True)


def _end_witnessed(
    directory: Path, ended: RunnerExit | str | None, witness: int, source: str, memory: bool = False
) -> TaskStatus:
    """How the runner ended as a source the tenant cannot write says (``witness``: its exit code, or
    128 + the signal that ended it): the runner's record only where it agrees (it tells an exit code
    of 143 from SIGTERM); a record that disagrees, is refused or is missing changes nothing. ``memory``:
    Slurm said its memory limit killed a process of it."""
    truth = witnessed(ended if isinstance(ended, RunnerExit) else None, witness)
    message = f"it ended, but {ended}; how it ended is {source}" if isinstance(ended, str) else ""
    if truth.exit_code is not None:
        return end_task(
            directory, TaskState.EXITED, exit_code=truth.exit_code, message=message, out_of_memory=memory
        )
    return end_task(directory, TaskState.KILLED, signal=truth.signal, message=message, out_of_memory=memory)


def _end_from_runner(directory: Path, ended: RunnerExit, memory: bool = False) -> TaskStatus:
    if ended.exit_code is not None:
        return end_task(directory, TaskState.EXITED, exit_code=ended.exit_code, out_of_memory=memory)
    return end_task(directory, TaskState.KILLED, signal=ended.signal, out_of_memory=memory)


def _reap(process: subprocess.Popen[bytes], record: Path) -> None:
    """Wait for a step's srun and write down its exit status (in the task's directory, the server's)."""
    code = process.wait()
    with contextlib.suppress(OSError):
        write_json(record, {"returncode": code, "pid": process.pid, "at": time.time()})


def _srun_words(directory: Path, launch: Mapping[str, Any]) -> str:
    """What the latest srun of a node task has said so far (its part of ``srun.log``, the server's file)."""
    try:
        with open(directory / "srun.log", "rb") as srun_log:
            srun_log.seek(int(launch.get("log_from", 0)))
            return srun_log.read(RECORD_LIMIT).decode(errors="replace")
    except (OSError, ValueError):
        return ""


def _batch_exit(job: Job | None, record: Mapping[str, Any]) -> int | None:
    """A sandbox's runner is its job's batch script: Slurm recorded how the runner ended (the program's
    code, or 128 + its signal; Slurm's signal when the script itself was killed), when the batch script
    ended by itself (COMPLETED, FAILED: a cancelled job's code is Slurm's own). None otherwise, and for
    a group (its batch script is srun, for all members) or a node task (a step)."""
    if job is None or grouped(record) or record.get("node_id") is not None:
        return None
    if job.state not in ("COMPLETED", "FAILED"):
        return None
    return 128 + job.signal if job.signal else job.exit_code


def _why_lost(directory: Path, job: Job | None) -> str:
    srun = tail(directory / "srun.log")
    state = f"its Slurm job is {job.state}" if job is not None else "its Slurm job is gone"
    return f"ended without a record: {state}" + (f"; srun: {srun}" if srun else "")
