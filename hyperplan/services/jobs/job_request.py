"""CreateTrainingJob, decoded once: the rules a request must pass and the frozen value the services keep.

The wire edge (``wire/ops/jobs.py``) calls :meth:`TrainingJobSpec.from_wire`, which checks every rule
that needs no store, in the order a person would fix them (the modes this back end does not serve, the
command, the channels and URIs), and decodes the request. The services take the value, never a dict.
The store keeps the request as it was given (``TrainingJob.request``, JSON): :meth:`TrainingJobSpec.to_json`
writes it and :meth:`TrainingJobSpec.from_json` reads it back, so stores written before this module read
the same.

A job may ask to book its own capacity instead of naming a plan (core/auto_book.py): on the wire as the
tag ``hyperplan:auto-book``, read here by :meth:`TrainingJobSpec.from_wire`; in the native API as the
``AutoBook`` structure, added by :meth:`TrainingJobSpec.with_auto_book`. The request is kept in a column
of its own (``TrainingJob.auto_book``), not in the stored CreateTrainingJob request, so :meth:`from_json`
leaves it out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from hyperplan.core.auto_book import TAG_KEY, AutoBookRequest, parse_tag
from hyperplan.core.image_refs import check_training_image
from hyperplan.core.jsonable import jsonable
from hyperplan.core.spot import check_spot_request
from hyperplan.errors import ValidationError
from hyperplan.objects.uris import StorageError, parse_s3_uri
from hyperplan.training.contract import (
    DEFAULT_CHECKPOINT_PATH,
    Channel,
    JobSpec,
    NoCommand,
    UnsupportedInput,
    build_contract,
    channel_name_problem,
    channel_variable_clashes,
    host_names,
    script_mode,
)

DEFAULT_MAX_RUNTIME = 86_400  # SageMaker's default MaxRuntimeInSeconds: one day
DEFAULT_VOLUME_GB = 30  # the SageMaker Python SDK's default VolumeSizeInGB
MAX_VOLUME_GB = 16_384  # the largest EBS volume

# Members that ask for something this deployment does not do; refused by name when they ask for it.
UNSERVED: dict[str, str] = {
    "DebugRuleConfigurations": "Debugger rule evaluations",
    "ProfilerRuleConfigurations": "profiler rule evaluations",
    "TensorBoardOutputConfig": "TensorBoard output",
    "ServerlessJobConfig": "serverless jobs",
    "MlflowConfig": "MLflow tracking",
    "ModelPackageConfig": "model packages",
    "RetryStrategy": "automatic retries",
}


@dataclass(frozen=True)
class Algorithm:
    """AlgorithmSpecification: the command to run (entrypoint and arguments) and the image that names the
    Python to run it with."""

    entrypoint: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    image: str | None = None


@dataclass(frozen=True)
class Checkpoints:
    """CheckpointConfig: where checkpoints are kept, and where the instances see them."""

    uri: str
    local_path: str = DEFAULT_CHECKPOINT_PATH


@dataclass(frozen=True)
class StoppingCondition:
    max_runtime_seconds: int | None = None
    max_pending_seconds: int | None = None
    max_wait_seconds: int | None = None  # managed spot training: the wait for capacity plus the run

    @property
    def max_runtime(self) -> int:
        return self.max_runtime_seconds or DEFAULT_MAX_RUNTIME


@dataclass(frozen=True)
class TrainingJobSpec:
    """A checked CreateTrainingJob request. `as_given` is the request as it was given (JSON-ready): it is
    what the store keeps and what DescribeTrainingJob echoes; the other fields are what the services
    read. Treat `as_given` and the mappings as read-only."""

    name: str
    instance_type: str
    instance_count: int
    plan_arn: str | None
    algorithm: Algorithm
    channels: tuple[Channel, ...]
    output_path: str
    checkpoints: Checkpoints | None
    hyperparameters: Mapping[str, str]
    environment: Mapping[str, str]
    stopping: StoppingCondition
    as_given: Mapping[str, Any]
    network_isolation: bool = False
    volume_size_gb: int = DEFAULT_VOLUME_GB
    """``ResourceConfig.VolumeSizeInGB``: the size of each instance's disk in containers (the SDK's default
    when the request gives none, or 0)."""
    auto_book: AutoBookRequest | None = None
    """The capacity the job books itself (it names no plan), or None. Checked against the fleet when the
    job is created (services/jobs/auto_booking.py)."""
    auto_book_member: str | None = None
    """Where the request came from, for refusals that name it: the native structure's member
    (``AutoBook``), or None for the tag."""
    spot: bool = False
    """``EnableManagedSpotTraining``: the job runs on idle instances plans lend, or on free on-demand
    capacity, waiting for them and interrupted when an owner takes them back (services/jobs/spot.py)."""

    @classmethod
    def from_wire(
        cls, request: Mapping[str, Any], runs_images: bool = False, across_nodes: bool = False
    ) -> TrainingJobSpec:
        """Check every rule that needs no store, then decode. Nothing is written before this passes.
        ``runs_images``: instances run in their image (runtime podman), so the image's own command
        serves a job that names none, and network isolation is served; ``across_nodes``: a job's
        instances run on several machines and talk over their network (the Slurm back end), so only a
        one-instance job can be cut off from it."""
        check_request(request, runs_images, across_nodes)
        tagged = _auto_book_tag(request)
        spec = cls.decode(request)
        if tagged is not None:
            spec = spec.with_auto_book(parse_tag(tagged), None)
        if runs_images and not spec.algorithm.image:
            raise ValidationError(
                "AlgorithmSpecification.TrainingImage is required: instances run in their image here."
            )
        instance = spec.instance("algo-1")
        if runs_images:
            instance = dataclasses.replace(instance, image_command=("train",))
        try:
            build_contract(instance, Path("/nonexistent"))  # pure: command and channels
        except NoCommand as exc:
            raise ValidationError(f"AlgorithmSpecification: {exc}.") from None
        except UnsupportedInput as exc:
            raise ValidationError(f"InputDataConfig: {exc}.") from None
        return spec

    def with_auto_book(self, request: AutoBookRequest, member: str | None) -> TrainingJobSpec:
        """This job booking its own capacity as `request` asks (`member`: the native structure's name,
        None for the tag). A job names a plan or books one, never both."""
        if self.plan_arn is not None:
            given = f"the {member} structure" if member else f"the tag {TAG_KEY}"
            raise ValidationError(
                f"ResourceConfig.TrainingPlanArn: a job that books its own capacity ({given}) names no "
                "plan; give a TrainingPlanArn or an auto-book request, not both."
            )
        if self.spot:
            raise ValidationError(
                "EnableManagedSpotTraining: a managed spot training job books no plan; give an auto-book "
                "request or EnableManagedSpotTraining, not both."
            )
        return dataclasses.replace(self, auto_book=request, auto_book_member=member)

    @classmethod
    def from_json(cls, text: str) -> TrainingJobSpec:
        """A stored request (checked when it was created), read back."""
        return cls.decode(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.as_given)

    @classmethod
    def decode(cls, request: Mapping[str, Any]) -> TrainingJobSpec:
        """The value of a request that passed :func:`check_request` (no rule is checked here)."""
        resources = request["ResourceConfig"]
        algorithm = request.get("AlgorithmSpecification") or {}
        checkpoint = request.get("CheckpointConfig") or {}
        stopping = request.get("StoppingCondition") or {}
        return cls(
            name=request["TrainingJobName"],
            instance_type=resources["InstanceType"],
            instance_count=resources["InstanceCount"],
            plan_arn=resources.get("TrainingPlanArn"),
            volume_size_gb=resources.get("VolumeSizeInGB") or DEFAULT_VOLUME_GB,
            algorithm=Algorithm(
                entrypoint=tuple(algorithm.get("ContainerEntrypoint") or ()),
                arguments=tuple(algorithm.get("ContainerArguments") or ()),
                image=algorithm.get("TrainingImage"),
            ),
            channels=_channels(request),
            output_path=request["OutputDataConfig"]["S3OutputPath"],
            checkpoints=(
                Checkpoints(checkpoint["S3Uri"], checkpoint.get("LocalPath") or DEFAULT_CHECKPOINT_PATH)
                if checkpoint.get("S3Uri")
                else None
            ),
            hyperparameters=dict(request.get("HyperParameters") or {}),
            environment=dict(request.get("Environment") or {}),
            stopping=StoppingCondition(
                max_runtime_seconds=stopping.get("MaxRuntimeInSeconds"),
                max_pending_seconds=stopping.get("MaxPendingTimeInSeconds"),
                max_wait_seconds=stopping.get("MaxWaitTimeInSeconds"),
            ),
            as_given=jsonable(request),
            network_isolation=bool(request.get("EnableNetworkIsolation")),
            spot=bool(request.get("EnableManagedSpotTraining")),
        )

    @property
    def checkpoint_uri(self) -> str | None:
        return self.checkpoints.uri if self.checkpoints else None

    def stopping_condition_echo(self) -> dict[str, Any]:
        """As DescribeTrainingJob echoes it: the request's, with the default MaxRuntimeInSeconds filled in."""
        condition = dict(self.as_given.get("StoppingCondition") or {})
        condition.setdefault("MaxRuntimeInSeconds", DEFAULT_MAX_RUNTIME)
        return condition

    def instance(
        self, host: str, segment_end: datetime | None = None, interpreter: str | None = None
    ) -> JobSpec:
        """The contract's view of one instance of the job. `interpreter` runs Python programs: the one
        the fleet file names for the job's image, else the server's own."""
        return JobSpec(
            job_name=self.name,
            instance_type=self.instance_type,
            hosts=host_names(self.instance_count),
            current_host=host,
            output_path=self.output_path,
            hyperparameters=dict(self.hyperparameters),
            channels=self.channels,
            environment=dict(self.environment),
            checkpoint_uri=self.checkpoint_uri,
            checkpoint_local_path=self.checkpoints.local_path
            if self.checkpoints
            else DEFAULT_CHECKPOINT_PATH,
            segment_end_epoch=int(segment_end.timestamp()) if segment_end else None,
            entrypoint=self.algorithm.entrypoint,
            arguments=self.algorithm.arguments,
            image_uri=self.algorithm.image,
            cpu_count=os.cpu_count() or 1,
            interpreter=interpreter or sys.executable,
        )


def _auto_book_tag(request: Mapping[str, Any]) -> str | None:
    """The value of the request's tag ``hyperplan:auto-book``, if it has one (the model checked each
    tag's characters and length; services/plans/tags.py refuses a key given twice)."""
    for tag in request.get("Tags") or ():
        if tag.get("Key") == TAG_KEY:
            return str(tag.get("Value", ""))
    return None


def _channels(request: Mapping[str, Any]) -> tuple[Channel, ...]:
    default_mode = (request.get("AlgorithmSpecification") or {}).get("TrainingInputMode") or "File"
    channels = []
    for channel in request.get("InputDataConfig") or []:
        s3 = channel["DataSource"].get("S3DataSource") or {}
        channels.append(
            Channel(
                name=channel["ChannelName"],
                uri=s3.get("S3Uri", ""),
                content_type=channel.get("ContentType"),
                input_mode=channel.get("InputMode") or default_mode,
                distribution=s3.get("S3DataDistributionType") or "FullyReplicated",
                data_type=s3.get("S3DataType") or "S3Prefix",
            )
        )
    return tuple(channels)


# -- the rules --------------------------------------------------------------------------------------


def check_request(request: Mapping[str, Any], runs_images: bool = False, across_nodes: bool = False) -> None:
    """Every rule on the request's members, in the order a person would fix them; each refusal names the
    member and what this back end needs instead."""
    _refuse_unserved(request, runs_images)
    _check_isolation_across_nodes(request, runs_images and across_nodes)
    resources = request.get("ResourceConfig")
    if not resources:
        raise ValidationError("ResourceConfig is required: give InstanceType and InstanceCount.")
    for member, what in (
        ("InstanceGroups", "heterogeneous clusters"),
        ("InstancePreferences", "instance preferences (flexible training plans)"),
        ("InstancePlacementConfig", "instance placement"),
    ):
        if resources.get(member):
            raise ValidationError(f"ResourceConfig.{member}: this deployment does not serve {what}.")
    if resources.get("KeepAlivePeriodInSeconds"):
        raise ValidationError("ResourceConfig.KeepAlivePeriodInSeconds: this deployment has no warm pools.")
    for member in ("InstanceType", "InstanceCount"):
        if member not in resources:
            raise ValidationError(f"ResourceConfig.{member} is required.")
    if resources["InstanceCount"] < 1:
        raise ValidationError("ResourceConfig.InstanceCount must be at least 1.")
    if (resources.get("VolumeSizeInGB") or 0) > MAX_VOLUME_GB:
        raise ValidationError(
            f"ResourceConfig.VolumeSizeInGB: at most {MAX_VOLUME_GB} (each instance's disk, as on EBS)."
        )
    _check_algorithm(request)
    _check_output(request)


def _refuse_unserved(request: Mapping[str, Any], runs_images: bool) -> None:
    for member, what in UNSERVED.items():
        if request.get(member):
            raise ValidationError(f"{member}: this deployment does not serve {what}.")
    stopping = request.get("StoppingCondition") or {}
    if request.get("EnableManagedSpotTraining"):
        names_plan = bool((request.get("ResourceConfig") or {}).get("TrainingPlanArn"))
        check_spot_request(stopping, names_plan)
        if _auto_book_tag(request) is not None:
            raise ValidationError(
                f"Tags: a managed spot training job books no plan; leave out the tag {TAG_KEY} or "
                "EnableManagedSpotTraining."
            )
    elif stopping.get("MaxWaitTimeInSeconds") is not None:
        raise ValidationError(
            "StoppingCondition.MaxWaitTimeInSeconds: it is for managed spot training "
            "(EnableManagedSpotTraining true); use MaxPendingTimeInSeconds to bound the wait for a plan's "
            "capacity."
        )
    if request.get("EnableNetworkIsolation") and not runs_images:
        raise ValidationError(
            "EnableNetworkIsolation: instances run as local processes here (runtime process) and cannot be "
            "cut off from the network."
        )
    if (request.get("RemoteDebugConfig") or {}).get("EnableRemoteDebug"):
        raise ValidationError("RemoteDebugConfig.EnableRemoteDebug: this deployment does not serve it.")
    if (request.get("InfraCheckConfig") or {}).get("EnableInfraCheck"):
        raise ValidationError("InfraCheckConfig.EnableInfraCheck: this deployment does not serve it.")


def _check_isolation_across_nodes(request: Mapping[str, Any], across_nodes: bool) -> None:
    count = (request.get("ResourceConfig") or {}).get("InstanceCount")
    if across_nodes and request.get("EnableNetworkIsolation") and isinstance(count, int) and count > 1:
        raise ValidationError(
            f"EnableNetworkIsolation: the {count} instances of a job run on {count} Slurm nodes here and "
            "talk over the nodes' network, so only a one-instance job can be cut off from the network "
            "(InstanceCount 1), or leave EnableNetworkIsolation out."
        )


def _check_algorithm(request: Mapping[str, Any]) -> None:
    algorithm = request.get("AlgorithmSpecification")
    if not algorithm:
        raise ValidationError(
            "AlgorithmSpecification is required: give TrainingInputMode and ContainerEntrypoint (or script "
            "mode hyperparameters)."
        )
    if algorithm.get("AlgorithmName"):
        raise ValidationError(
            "AlgorithmSpecification.AlgorithmName: this deployment runs commands, not algorithm resources; "
            "give ContainerEntrypoint."
        )
    if algorithm.get("TrainingInputMode") == "Pipe":
        raise ValidationError(
            "AlgorithmSpecification.TrainingInputMode: Pipe mode is not served by this back end; use File "
            "or FastFile."
        )
    if algorithm.get("TrainingImage") is not None:
        try:
            check_training_image(algorithm["TrainingImage"])
        except ValidationError as error:
            raise ValidationError(f"AlgorithmSpecification.TrainingImage: {error.message}.") from None
    for index, channel in enumerate(request.get("InputDataConfig") or []):
        _check_channel(channel, f"InputDataConfig[{index}]")
    names = [channel["ChannelName"] for channel in request.get("InputDataConfig") or []]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValidationError(
            f"InputDataConfig: channel name(s) {', '.join(repeated)} appear more than once."
        )
    for variable, clashing in channel_variable_clashes(names).items():
        raise ValidationError(
            f"InputDataConfig: channels {' and '.join(map(repr, clashing))} would both set {variable}; "
            "rename one."
        )


def _check_channel(channel: Mapping[str, Any], where: str) -> None:
    problem = channel_name_problem(channel["ChannelName"])
    if problem is not None:  # its objects would land outside input/data/NAME
        raise ValidationError(f"{where}.ChannelName: {channel['ChannelName']!r} {problem}.")
    source = channel["DataSource"]
    s3 = source.get("S3DataSource")
    if s3 is None:
        raise ValidationError(
            f"{where}.DataSource: only S3DataSource is served by this back end (buckets map to storage in "
            "the fleet file)."
        )
    for member, what in (
        ("InstanceGroupNames", "heterogeneous clusters"),
        ("ModelAccessConfig", "model access configuration"),
        ("HubAccessConfig", "hub content"),
        ("AttributeNames", "augmented manifests"),
    ):
        if s3.get(member):
            raise ValidationError(
                f"{where}.DataSource.S3DataSource.{member}: this deployment does not serve {what}."
            )
    if channel.get("CompressionType") == "Gzip":
        raise ValidationError(f"{where}.CompressionType: Gzip (a Pipe-mode feature) is not served; use None.")
    if channel.get("RecordWrapperType") == "RecordIO":
        raise ValidationError(f"{where}.RecordWrapperType: RecordIO (a Pipe-mode feature) is not served.")
    if channel.get("ShuffleConfig"):
        raise ValidationError(f"{where}.ShuffleConfig: a Pipe-mode feature, not served.")
    if channel.get("InputMode") == "Pipe":
        raise ValidationError(
            f"{where}.InputMode: Pipe mode is not served by this back end; use File or FastFile."
        )
    _check_uri(s3["S3Uri"], f"{where}.DataSource.S3DataSource.S3Uri")


def _check_output(request: Mapping[str, Any]) -> None:
    output = request["OutputDataConfig"]
    _check_uri(output["S3OutputPath"], "OutputDataConfig.S3OutputPath")
    if output.get("CompressionType") == "NONE":
        raise ValidationError(
            "OutputDataConfig.CompressionType: NONE is not served; the model is stored as model.tar.gz."
        )
    checkpoint = request.get("CheckpointConfig")
    if checkpoint:
        _check_uri(checkpoint["S3Uri"], "CheckpointConfig.S3Uri")
    script = script_mode(request.get("HyperParameters") or {})
    if script is not None and script.submit_directory.startswith("s3://"):
        # The code is fetched from there at launch: a URI that may not be read is refused now, not then.
        _check_uri(script.submit_directory, "HyperParameters.sagemaker_submit_directory")


def _check_uri(uri: str, where: str) -> None:
    try:
        parse_s3_uri(uri)
    except StorageError as exc:
        raise ValidationError(
            f"{where}: {exc.reason} ({uri}); this deployment stores objects at s3:// URIs."
        ) from None
