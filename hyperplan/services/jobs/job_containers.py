"""A training job's instances as containers (runtime ``podman``): its image pulled once per attempt, and
each instance's container: the account's ids, the instance type's limits, the job's pod and network.

The image is pulled before any instance's tree is prepared, by the reference the job resolved to at
creation, logging in with the registry's sealed credentials; a pull that fails fails the job, its reason
naming the image, before any instance starts (so nothing is metered for it). The digest pulled goes into
the job's status message, so the job's history says what ran, and every instance's container is made
from the image *by that digest*, so all of them run the same image even if its tag moves meanwhile.

Inside, the instance's tree is ``/opt/ml`` (``training/contract.py``); the job's instances share a pod
named after the attempt, where ``algo-1..N`` are the pod's loopback; with ``EnableNetworkIsolation`` the
pod has no way out, otherwise the server's endpoint is reachable inside at ``127.0.0.1`` on its port
(``AWS_ENDPOINT_URL`` says so, unless the job sets its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hyperplan.backends.base import ContainerSpec, IdMap, Limits, Mount, Placement, RunAs, TaskSpec
from hyperplan.backends.images import ImageInfo
from hyperplan.core.image_refs import parse_image
from hyperplan.services.accounts import registry_credentials
from hyperplan.services.jobs import job_disks
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime import tenancy
from hyperplan.services.runtime.containment import limits_for
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from hyperplan.training.contract import SAGEMAKER_BASE, JobSpec, Layout, build_contract

INSIDE_ROOT = Path(SAGEMAKER_BASE)
INTERPRETER_INSIDE = "python3"  # the image's own Python runs `python` commands and script mode


@dataclass(frozen=True)
class JobImage:
    """What every instance of one attempt runs in."""

    info: ImageInfo
    ids: IdMap
    limits: Limits
    owner: RunAs
    """Who root inside is on the host, who owns the instances' trees: the first id of the account's block
    (Podman), or the account's own user (on Slurm: rootless runc maps that one id)."""
    run_as: RunAs | None = None
    """On Slurm: the account's user, whom Slurm runs the instances as (None: the local back end)."""


def runs_in_containers(runtime: ServiceContext) -> bool:
    return runtime.images is not None


def pull_image(runtime: ServiceContext, job: TrainingJob, request: TrainingJobSpec) -> JobImage:
    """Pull the job's image; :class:`~hyperplan.backends.images.ImageUnavailable` (or ValueError for a
    job that names none) says why it cannot be."""
    assert runtime.images is not None
    reference = job.resolved_image or request.algorithm.image
    if not reference:
        raise ValueError("the job names no TrainingImage, and instances run in their image here")
    host = parse_image(reference).registry_host
    login = registry_credentials.login_for(runtime.db, runtime.secret_box, host)
    info = runtime.images.pull(reference, login, runtime.fleet.image_sources.insecure(host))
    limits = limits_for(runtime, job.instance_type, job.availability_zone)
    if runtime.slurm is not None:
        user = tenancy.run_as(runtime, job.account_id)
        assert user is not None  # the Slurm back end runs in isolation mode users
        return JobImage(info, IdMap(user.uid, 1), limits, user, user)
    ids = tenancy.container_ids(runtime, job.account_id)
    return JobImage(info, ids, limits, RunAs("root", ids.host_first, ids.host_first))


def instance_spec(spec: JobSpec, image: JobImage) -> JobSpec:
    """The instance as its container sees it: the image's Python, and the image's own command when the
    job names none."""
    return dataclasses.replace(
        spec,
        interpreter=INTERPRETER_INSIDE,
        image_command=image.info.train_command(),
        image_workdir=image.info.workdir or "/",
    )


def instance_task(
    runtime: ServiceContext,
    task_id: str,
    spec: JobSpec,
    root: Path,
    image: JobImage,
    pod: str,
    isolated_network: bool,
    where: Placement | None,
) -> TaskSpec:
    """The back end's task for one instance whose tree (``root``, on the host) is ready."""
    contract = build_contract(spec, INSIDE_ROOT)
    mounts = [Mount(root, str(INSIDE_ROOT)), *job_disks.mounts(root)]
    checkpoints = contract.layout.checkpoint_dir
    if not checkpoints.is_relative_to(INSIDE_ROOT):  # LocalPath elsewhere: its files are in the tree
        mounts.append(Mount(Layout(root, spec.checkpoint_local_path).checkpoint_dir, str(checkpoints)))
    endpoint = None if isolated_network else runtime.settings.endpoint
    env = contract.process_environment({})
    if endpoint is not None:
        # A pod reaches the server at its loopback (the relay); on Slurm a container is on its node's
        # network and reaches the server where it listens.
        inside = f"127.0.0.1:{endpoint.rsplit(':', 1)[1]}" if runtime.slurm is None else endpoint
        env.setdefault("AWS_ENDPOINT_URL", f"http://{inside}")
    env.setdefault("AWS_REGION", runtime.region)
    env.setdefault("AWS_DEFAULT_REGION", runtime.region)
    container = ContainerSpec(
        image=image.info.pinned,
        ids=image.ids,
        limits=image.limits,
        pod=pod,
        hosts=spec.hosts,
        endpoint=endpoint,
        mounts=tuple(mounts),
    )
    return TaskSpec(
        task_id,
        contract.command.argv,
        None,
        env,
        contract.command.cwd,
        image.run_as,
        where,
        container,
    )
