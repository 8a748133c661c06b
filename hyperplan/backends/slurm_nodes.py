"""The Slurm back end's nodes, each one a whole-node batch job: its directory, its job, its status.

The node's batch script (``node.sh``) runs OnCreate through the step runner, then holds the node until
a SIGTERM reaches it. Once final, a node's state is written down (``state.json``): Slurm may forget a
finished job, and its tasks still queued end with it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from signal import Signals
from typing import Any

from hyperplan.backends import slurm_containers, tenant_files
from hyperplan.backends.agent import RUN_SCRIPT
from hyperplan.backends.base import (
    BackendError,
    Mount,
    NodeSpec,
    NodeState,
    NodeStatus,
    RunAs,
    SpecConflict,
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
from hyperplan.backends.runner_records import RunnerExit
from hyperplan.backends.slurm_images import SlurmImages
from hyperplan.backends.slurm_queue import LIVE_JOB_STATES, SlurmQueue
from hyperplan.backends.slurm_records import (
    SlurmDirs,
    end_queued_tasks,
    job_id_of,
    nonce,
    placement_from,
    read_json,
    run_as_from,
    runner_exit,
    write_json,
)
from hyperplan.backends.slurm_submit import (
    RECLAIM_DIR,
    SUBMIT_RETRY_SECONDS,
    Submitter,
    base_env,
    not_yet,
    write_runner_spec,
)
from hyperplan.slurm.client import SlurmError

HOOK_SCRIPT = '[ -e "$1" ] || exit 0; ' + RUN_SCRIPT
"""How a reclaim hook runs (the local agent's way, as OnCreate runs), nothing when the node's copy of
its lifecycle has no such file: whether it has is the node's user's to see, not the server's (root)."""
CANCEL_AGAIN_SECONDS = 10.0
"""A node being failed (its OnCreate record says so) is cancelled again this often until its job ends."""


def node_record(spec: NodeSpec) -> dict[str, Any]:
    """What ``node.json`` holds of a spec: a second provision with the same id must match it."""
    record = {
        "node_id": spec.node_id,
        "name": spec.name,
        "instance_type": spec.instance_type,
        "env": dict(spec.env),
        "lifecycle_source": str(spec.lifecycle_source.resolve()) if spec.lifecycle_source else None,
        "on_create": spec.on_create,
        "on_create_args": list(spec.on_create_args),
        "run_as": run_as_record(spec.run_as),
        "placement": placement_record(spec.placement),
    }
    container = slurm_containers.record(spec.container)
    if container is not None:  # (a record without one reads as before containers)
        record["container"] = container
    return record


class NodeJobs:
    """The nodes under ``dirs.nodes`` as Slurm jobs (callers hold the back end's lock)."""

    def __init__(
        self, dirs: SlurmDirs, queue: SlurmQueue, submitter: Submitter, images: SlurmImages | None = None
    ) -> None:
        self.dirs = dirs
        self.queue = queue
        self.submitter = submitter
        self.images = images  # where containers' images are unpacked; None: this back end runs none

    def provision(self, spec: NodeSpec, record: Mapping[str, Any]) -> None:
        directory = self.dirs.nodes / spec.node_id
        existing = read_json(directory / "node.json")
        if existing is not None:
            if {k: existing.get(k) for k in record} != record:
                raise SpecConflict(f"node {spec.node_id} exists with another spec")
            self.submit(directory)
            return
        self._prepare(directory, spec, record)
        write_json(directory / "node.json", {**record, "created_at": time.time(), "nonce": nonce()})
        if spec.container is not None and self.images is not None:  # pulled (with its login) and unpacked
            self.images.prepare(spec.container.image, spec.image_login, spec.container.insecure_registry)
        self.submit(directory)

    def _prepare(self, directory: Path, spec: NodeSpec, record: Mapping[str, Any]) -> None:
        shutil.rmtree(directory, ignore_errors=True)  # what a forgotten node of this id left behind
        make_dir(directory, PASSAGE_MODE)
        make_dir(directory / "env", READABLE_DIR_MODE)
        home = directory / "home"
        make_dir(home, 0o700)
        if spec.lifecycle_source is not None:
            try:
                shutil.copytree(spec.lifecycle_source, home / "lifecycle", symlinks=True, dirs_exist_ok=True)
            except (OSError, shutil.Error) as error:
                raise BackendError(f"cannot copy the lifecycle scripts: {error}") from None
        cwd = home
        if spec.on_create is not None:
            script = home / "lifecycle" / spec.on_create
            cwd = script.parent
            try:
                argv = tenant_files.lifecycle_argv(script, spec.on_create_args)
            except (OSError, tenant_files.Refused) as refused:
                raise BackendError(f"OnCreate script {spec.on_create}: {refused}") from None
            if spec.container is not None:
                self._describe_on_create(directory, spec, record, argv, cwd)
            else:
                env = {**base_env(home, spec.run_as, directory), **dict(spec.env)}
                write_runner_spec(directory / "oncreate", argv, env, cwd, spec.run_as, directory / "env")
        elif spec.container is not None:
            self._own_dirs(directory, spec)
        out = directory / "out"
        make_dir(out, 0o700)
        if spec.run_as is not None:
            hand_over(home, spec.run_as)
            os.chown(out, spec.run_as.uid, spec.run_as.gid)
        script_text = self.submitter.node_script(directory, spec.on_create is not None)
        write_atomically(directory / "node.sh", script_text.encode(), READABLE_FILE_MODE)

    def _own_dirs(self, directory: Path, spec: NodeSpec) -> list[Mount]:
        if spec.run_as is None or self.images is None:
            raise BackendError(
                f"node {spec.node_id}: containers on Slurm run as the account's user, from a back end "
                "with a Podman store (runtime podman)"
            )
        return slurm_containers.own_dirs(directory, slurm_containers.NODE_DIRS, spec.run_as)

    def _describe_on_create(
        self, directory: Path, spec: NodeSpec, record: Mapping[str, Any], argv: list[str], cwd: Path
    ) -> None:
        """OnCreate in a container of the node's image, its home and scratch the node's own."""
        own = self._own_dirs(directory, spec)
        assert spec.run_as is not None
        home = directory / "home"
        script = home / "lifecycle" / str(spec.on_create)
        argv = [slurm_containers.inside(script, home) if arg == str(script) else arg for arg in argv]
        program = (argv, slurm_containers.inside_env(spec.env), slurm_containers.inside(cwd, home))
        oncreate = directory / "oncreate"
        make_dir(oncreate, PASSAGE_MODE)
        slurm_containers.lay_out(
            oncreate, record["container"], spec.run_as, program, spec.name, own, directory / "env",
            f"{spec.node_id}.oncreate",
        )  # fmt: skip

    def _image_ready(self, directory: Path, record: Mapping[str, Any]) -> bool:
        """A node of containers is submitted once its image is unpacked (its OnCreate's template
        written); one whose image cannot be had fails, saying why."""
        container = record.get("container")
        if container is None or self.images is None:
            return True
        image = container["image"]
        if self.images.rootfs(image) is None:
            problem = self.images.problem(image)
            if problem is not None:
                self.settle(directory, NodeState.FAILURE, f"its image cannot be used: {problem}")
            else:
                self.images.prepare(image, None, bool(container["insecure_registry"]))  # (after a restart)
            return False
        found = slurm_containers.ready(directory / "oncreate", self.images)
        if isinstance(found, str):
            self.settle(directory, NodeState.FAILURE, f"its image cannot be used: {found}")
            return False
        return found

    def prepare_hook(self, directory: Path, name: str) -> bool:
        """Write the runner spec of the node's lifecycle script ``name`` (on_reclaim.sh) that its batch
        script runs at its next SIGTERM, as OnCreate ran (the node's user and environment, the published
        variables, in a container of the node's image when its OnCreate ran in one, its output in the
        node's log); False when the node cannot run one: it is not held (Running) yet, or it has no
        lifecycle (or, in a container, its image is not unpacked)."""
        record = read_json(directory / "node.json")
        if record is None or record.get("lifecycle_source") is None:
            return False
        if "/" in name or name in ("", ".", "..") or not tenant_files.exists(directory / "out" / "held"):
            return False
        home = directory / "home"
        script = home / "lifecycle" / name
        logs = directory / "oncreate" / "out"  # the node's log, when it ran an OnCreate
        log_dir = logs if logs.is_dir() else None
        if record.get("container") is not None:
            return self._prepare_hook_in_container(directory, record, name, script, log_dir)
        run_as = run_as_from(record)
        env = {**base_env(home, run_as, directory), **dict(record["env"])}
        write_runner_spec(
            directory / RECLAIM_DIR, ["/bin/sh", "-c", HOOK_SCRIPT, name, str(script)], env, script.parent,
            run_as, directory / "env", log_dir=log_dir,
        )  # fmt: skip
        return True

    def _prepare_hook_in_container(
        self, directory: Path, record: Mapping[str, Any], name: str, script: Path, log_dir: Path | None
    ) -> bool:
        """The hook in a container of the node's image laid out as OnCreate's (``_describe_on_create``):
        the node's own directories, root inside, the lifecycle copy at ``/root/lifecycle``. Its template
        is written now (the image is unpacked: the node runs); without one nothing is left to run."""
        run_as = run_as_from(record)
        if run_as is None or self.images is None:
            return False
        home = directory / "home"
        inside = slurm_containers.inside(script, home)
        program = (
            ["/bin/sh", "-c", HOOK_SCRIPT, name, inside],
            slurm_containers.inside_env(record["env"]),
            slurm_containers.inside(script.parent, home),
        )
        reclaim = directory / RECLAIM_DIR
        make_dir(reclaim, PASSAGE_MODE)
        slurm_containers.lay_out(
            reclaim, record["container"], run_as, program, record["name"],
            slurm_containers.node_mounts(directory), directory / "env", f"{record['node_id']}.reclaim",
            log_dir=log_dir,
        )  # fmt: skip
        if slurm_containers.ready(reclaim, self.images) is not True:
            (reclaim / "run.json").unlink(missing_ok=True)  # the batch script then runs no hook
            return False
        return True

    def submit(self, directory: Path) -> None:
        """Submit the node's job unless it has one (or is settled); a refusal because the reservation
        does not exist yet is tried again at the next look."""
        if (directory / "job.json").exists() or (directory / "state.json").exists():
            return
        record = read_json(directory / "node.json")
        assert record is not None
        if (directory / "terminate.json").exists():
            self.settle(directory, NodeState.TERMINATED, "")
            return
        if not self._image_ready(directory, record):
            return
        name = f"{self.queue.prefix}n.{record['node_id']}.{record.get('nonce', '')}"
        placement = placement_from(record.get("placement"))
        options = self.submitter.batch_options(name, 1, directory, placement)
        self._submit(directory, directory / "node.sh", options, run_as_from(record), record)

    def _submit(
        self,
        directory: Path,
        script: Path,
        options: Sequence[str],
        run_as: RunAs | None,
        record: Mapping[str, Any],
    ) -> None:
        found = self.queue.job_named(options[0].split("=", 1)[1])
        if found is not None:  # submitted before a crash, its id not recorded
            write_json(directory / "job.json", {"job_id": found.id})
            return
        try:
            job_id = self.submitter.sbatch(script, options, run_as)
        except SlurmError as error:
            created = float(record.get("created_at", time.time()))
            if not_yet(error) and time.time() - created < SUBMIT_RETRY_SECONDS:
                write_json(directory / "submit-error.json", {"error": error.detail})
                return
            self.settle(directory, NodeState.FAILURE, f"Slurm refused the job: {error.detail}")
            return
        write_json(directory / "job.json", {"job_id": job_id})
        self.queue.forget()

    def status(self, directory: Path) -> NodeStatus:
        settled = read_json(directory / "state.json")
        if settled is not None:
            return NodeStatus(
                NodeState(settled["state"]), settled.get("message", ""), settled.get("host", "")
            )
        self.submit(directory)
        settled = read_json(directory / "state.json")
        if settled is not None:
            return NodeStatus(NodeState(settled["state"]), settled.get("message", ""))
        terminating = (directory / "terminate.json").exists()
        job_id = job_id_of(directory)
        if job_id is None:
            return NodeStatus(NodeState.SHUTTING_DOWN if terminating else NodeState.PENDING)
        job = self.queue.job(job_id)
        host = job.nodes[0] if job is not None and job.nodes else ""
        failed = self._on_create_failure(directory, runner_exit(directory / "oncreate" / "out" / "exit.json"))
        if job is None or job.state not in LIVE_JOB_STATES:
            if terminating:
                return self.settle(directory, NodeState.TERMINATED, "", host)
            if failed:
                return self.settle(directory, NodeState.FAILURE, failed, host)
            state = job.state if job is not None else "gone from Slurm"
            if state == "TIMEOUT":
                state += " (its time limit: the end of its reservation, or the next reservation on its node)"
            elif state == "NODE_FAIL":
                state += f" (its Slurm node {host or '?'} failed)"
            return self.settle(
                directory, NodeState.FAILURE, f"the node's Slurm job {job_id} ended: {state}", host
            )
        if terminating:
            return NodeStatus(NodeState.SHUTTING_DOWN, host=host)
        if failed:
            # Settled only once Slurm says the job has ended: the record is the user's word, and a node
            # forgotten while its job runs would escape every later kill.
            marker = directory / "failing"
            if not tenant_files.exists(marker) or time.time() - marker.stat().st_mtime > CANCEL_AGAIN_SECONDS:
                marker.touch()  # (cancelled again now and then: a cancel Slurm did not take is not final)
                self.queue.cancel(str(job_id))
            return NodeStatus(NodeState.PENDING, host=host)
        if job.state == "RUNNING" and tenant_files.exists(directory / "out" / "held"):
            return NodeStatus(NodeState.RUNNING, host=host)
        return NodeStatus(NodeState.PENDING, host=host)

    def _on_create_failure(self, directory: Path, ended: RunnerExit | str | None) -> str:
        if ended is None or (isinstance(ended, RunnerExit) and ended.exit_code == 0):
            return ""
        record = read_json(directory / "node.json") or {}
        if isinstance(ended, str):
            return f"OnCreate script {record.get('on_create')} ended, but {ended}"
        how = (
            f"exited with code {ended.exit_code}" if ended.exit_code is not None else _killed_by(ended.signal)
        )
        output = tail(directory / "oncreate" / "out" / "stderr.log")
        return f"OnCreate script {record.get('on_create')} {how}" + (f": {output}" if output else "")

    def settle(self, directory: Path, state: NodeState, message: str, host: str = "") -> NodeStatus:
        """Write down a node's final state; its tasks still queued for it end with it."""
        write_json(directory / "state.json", {"state": state.value, "message": message, "host": host})
        if state in (NodeState.FAILURE, NodeState.TERMINATED):
            end_queued_tasks(self.dirs, directory.name, f"its node is {state.value}")
        return NodeStatus(state, message, host)


def _killed_by(signal: int | None) -> str:
    try:
        return f"was killed by {Signals(signal or 0).name}"
    except ValueError:
        return f"was killed by signal {signal}"
