"""The SageMaker training contract for one instance of a job, as values (no I/O here).

On SageMaker a training container finds everything under ``/opt/ml``. A job here is a process on a
shared machine, so every instance gets a root directory of its own, chosen by the caller, and each
``/opt/ml/X`` becomes ``ROOT/X``::

    ROOT/input/config/hyperparameters.json   the job's HyperParameters, as sent (string values)
    ROOT/input/config/resourceconfig.json    current_host, hosts, network_interface_name, ...
    ROOT/input/config/inputdataconfig.json   per channel: ContentType, TrainingInputMode, ...
    ROOT/input/data/CHANNEL/                 the channel's objects (File mode; FastFile is served as File)
    ROOT/model/                              packed to OUTPUT_PATH/JOB_NAME/output/model.tar.gz
    ROOT/output/data/                        packed to OUTPUT_PATH/JOB_NAME/output/output.tar.gz
    ROOT/output/intermediate/, ROOT/output/failure
    ROOT/checkpoints/                        CheckpointConfig.LocalPath (/opt/ml/checkpoints by default)
    ROOT/code/                               script mode: the unpacked sourcedir.tar.gz; the working dir

The ``SM_*`` variables point at those paths (never at ``/opt/ml``), ``SAGEMAKER_BASE_DIR`` is ROOT (the
SageMaker training toolkit reads it in place of ``/opt/ml``), and ``SM_CHECKPOINT_DIR``, which SageMaker
does not set, names the real checkpoint directory for scripts that would otherwise hard-code
``/opt/ml/checkpoints``.

In a container the tree is mounted at ``/opt/ml`` (and the checkpoint directory at LocalPath, wherever
that is), and the contract the program gets is built with ``/opt/ml`` as its root: its variables then
name ``/opt/ml``, as SageMaker's do.

The command is ContainerEntrypoint + ContainerArguments when an entrypoint is given (a leading ``python``
or ``python3`` is the image's interpreter), otherwise script mode when the hyperparameters carry
``sagemaker_program`` and ``sagemaker_submit_directory`` (as the SageMaker Python SDK sets them; there
ContainerArguments, meant for an image's entry point, are ignored), otherwise, where the job runs in its
image, what ``docker run IMAGE train`` runs (``JobSpec.image_command``); without an image (the ``process``
runtime) anything else is :class:`NoCommand`.

Hyperparameter values are decoded as the training toolkit does: a value that is valid JSON becomes that
JSON value (the SDK JSON-encodes every value), any other stays the string. ``sagemaker_*`` ones are the
framework's, the others the user's: those go to ``SM_HPS``, ``SM_HP_<NAME>`` and, in script mode, the
program's arguments (``--name value``, in name order). In variable names, characters a shell cannot name
(``-``, ``.``) become ``_``: ``SM_HP_LEARNING_RATE``, ``SM_CHANNEL_TRAIN_DATA``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

SAGEMAKER_BASE = PurePosixPath("/opt/ml")
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
INSTANCE_GROUP = "homogeneousCluster"
FRAMEWORK_PREFIX = "sagemaker_"
PROGRAM_PARAMETER = "sagemaker_program"
SUBMIT_DIR_PARAMETER = "sagemaker_submit_directory"
LOG_LEVEL_PARAMETER = "sagemaker_container_log_level"
CAPACITY_EXPIRATION_VARIABLE = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
PYTHON_NAMES = ("python", "python3")
SERVED_INPUT_MODES = ("File", "FastFile")


class NoCommand(ValueError):
    """The job says nothing this back end can run."""


class UnsupportedInput(ValueError):
    """A channel asks for something this back end does not serve (Pipe mode, manifest files)."""


@dataclass(frozen=True)
class Channel:
    """One InputDataConfig entry with an S3 data source."""

    name: str
    uri: str
    content_type: str | None = None
    input_mode: str = "File"
    distribution: str = "FullyReplicated"  # or ShardedByS3Key
    data_type: str = "S3Prefix"


@dataclass(frozen=True)
class JobSpec:
    """What one instance of a training job needs to know. ``hosts`` are the names of all its instances
    (``algo-1``, ``algo-2``, ...; see :func:`host_names`), ``current_host`` is this one's."""

    job_name: str
    instance_type: str
    hosts: tuple[str, ...]
    current_host: str
    output_path: str
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    channels: tuple[Channel, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    checkpoint_local_path: str = DEFAULT_CHECKPOINT_PATH
    segment_end_epoch: int | None = None
    """The end of the plan segment the job runs in (epoch seconds); None when it is not plan-backed."""
    entrypoint: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    image_uri: str | None = None
    interpreter: str = sys.executable
    """The Python the fleet file names for the image (default: the server's own)."""
    cpu_count: int = 1
    network_interface_name: str = "lo"  # a local back end's instances talk over loopback
    image_command: tuple[str, ...] | None = None
    """What ``docker run IMAGE train`` runs (the image's ENTRYPOINT and ``train``), for a job that names
    neither an entry point nor script mode; None where no image is run (the ``process`` runtime)."""
    image_workdir: str = "/"

    def __post_init__(self) -> None:
        if self.current_host not in self.hosts:
            raise ValueError(f"current host {self.current_host!r} is not one of the hosts {list(self.hosts)}")

    @property
    def instance_count(self) -> int:
        return len(self.hosts)

    @property
    def script(self) -> ScriptMode | None:
        return script_mode(self.hyperparameters)


@dataclass(frozen=True)
class ScriptMode:
    """The SDK's entry_point (``sagemaker_program``) and its uploaded source_dir
    (``sagemaker_submit_directory``, the s3:// URI of a sourcedir.tar.gz)."""

    program: str
    submit_directory: str


@dataclass(frozen=True)
class Layout:
    """The paths of one instance's directory tree under ``root`` (each stands for ``/opt/ml/...``)."""

    root: Path
    checkpoint_local_path: str = DEFAULT_CHECKPOINT_PATH

    @property
    def input_dir(self) -> Path:
        return self.root / "input"

    @property
    def input_config_dir(self) -> Path:
        return self.input_dir / "config"

    @property
    def input_data_dir(self) -> Path:
        return self.input_dir / "data"

    def channel_dir(self, name: str) -> Path:
        problem = channel_name_problem(name)
        if problem is not None:  # refused at CreateTrainingJob; this guards the tree all the same
            raise ValueError(f"channel {name!r}: {problem}")
        return self.input_data_dir / name

    @property
    def hyperparameters_file(self) -> Path:
        return self.input_config_dir / "hyperparameters.json"

    @property
    def resource_config_file(self) -> Path:
        return self.input_config_dir / "resourceconfig.json"

    @property
    def input_data_config_file(self) -> Path:
        return self.input_config_dir / "inputdataconfig.json"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def output_intermediate_dir(self) -> Path:
        return self.output_dir / "intermediate"

    @property
    def failure_file(self) -> Path:
        """Where an algorithm writes why it failed (SageMaker shows it as the FailureReason)."""
        return self.output_dir / "failure"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def checkpoint_dir(self) -> Path:
        if self.root == Path(SAGEMAKER_BASE):  # a container's own tree: the path is what it says
            return Path(self.checkpoint_local_path)
        return self.root / rebased(self.checkpoint_local_path)

    @property
    def scratch_dir(self) -> Path:
        """hyperplan's own working files (tarballs on their way); not part of the contract."""
        return self.root / ".hyperplan"

    def directories(self, channels: Sequence[Channel] = ()) -> list[Path]:
        """Every directory of the tree, parents first."""
        fixed = [
            self.input_config_dir,
            self.input_data_dir,
            self.model_dir,
            self.output_data_dir,
            self.output_intermediate_dir,
            self.checkpoint_dir,
            self.code_dir,
        ]
        return fixed + [self.channel_dir(channel.name) for channel in channels]


def channel_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a channel, whose objects go to ``input/data/NAME``; None if it can be.
    (The model's pattern allows ``.`` and ``..``, which would put them in ``input/data`` itself or in
    ``input``, over the job's own ``config/*.json``.)"""
    if name in (".", ".."):
        return "names input/data itself or its parent, not a directory of its own"
    if not name or any(char in name for char in "/\\\0"):
        return "must be one directory name, without '/'"
    return None


def channel_variable_clashes(names: Sequence[str]) -> dict[str, list[str]]:
    """Channels whose SM_CHANNEL_<NAME> variables would be the same (``train-data``, ``train.data``):
    variable -> the names, for each variable more than one channel would set."""
    by_variable: dict[str, list[str]] = {}
    for name in names:
        by_variable.setdefault(env_name("SM_CHANNEL_", name), []).append(name)
    return {variable: found for variable, found in by_variable.items() if len(found) > 1}


def rebased(local_path: str) -> PurePosixPath:
    """The path under a job's root that stands for a container path: ``/opt/ml/X`` -> ``X``; any other
    path keeps its whole name under the root (``/data/ckpt`` -> ``data/ckpt``), so two jobs on one
    machine never share a directory."""
    path = PurePosixPath(local_path)
    if ".." in path.parts:
        raise ValueError(f"{local_path!r}: a local path may not contain '..'")
    if path.is_relative_to(SAGEMAKER_BASE):
        return path.relative_to(SAGEMAKER_BASE)
    return path.relative_to("/") if path.is_absolute() else path


def host_names(count: int) -> tuple[str, ...]:
    """SageMaker's names for a job's instances: ``algo-1`` .. ``algo-N``."""
    return tuple(f"algo-{index}" for index in range(1, count + 1))


# --- hyperparameters ---------------------------------------------------------------------------------


def decode_value(text: str) -> Any:
    """A hyperparameter value as the toolkit sees it: the JSON value if the text is JSON, else the text."""
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return text


def split_hyperparameters(hyperparameters: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the user's hyperparameters, the framework's ``sagemaker_*`` ones), values decoded."""
    decoded = {name: decode_value(value) for name, value in hyperparameters.items()}
    user = {name: value for name, value in decoded.items() if not name.startswith(FRAMEWORK_PREFIX)}
    framework = {name: value for name, value in decoded.items() if name.startswith(FRAMEWORK_PREFIX)}
    return user, framework


def hyperparameter_args(user_hyperparameters: Mapping[str, Any]) -> list[str]:
    """``--name value`` for each hyperparameter, in name order (``-n`` for one-letter names); a mapping
    value becomes ``k=v,k2=v2``; other values are written as Python prints them, as the toolkit does."""
    args: list[str] = []
    for name in sorted(user_hyperparameters):
        value = user_hyperparameters[name]
        args.append(f"--{name}" if len(name) > 1 else f"-{name}")
        if isinstance(value, Mapping):
            args.append(",".join(f"{key}={item}" for key, item in sorted(value.items())))
        else:
            args.append("" if value is None else str(value))
    return args


def env_text(value: Any) -> str:
    """An environment value: strings as they are, anything else as compact JSON with sorted keys."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def script_mode(hyperparameters: Mapping[str, str]) -> ScriptMode | None:
    """The script-mode program and code location, if both are set."""
    _, framework = split_hyperparameters(hyperparameters)
    program, submit = framework.get(PROGRAM_PARAMETER), framework.get(SUBMIT_DIR_PARAMETER)
    if program is None or submit is None:
        return None
    return ScriptMode(str(program), str(submit))


# --- the command -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    cwd: Path


def build_command(spec: JobSpec, layout: Layout, user_args: Sequence[str]) -> Command:
    if spec.entrypoint:
        return Command(_with_interpreter(spec.entrypoint, spec.interpreter) + spec.arguments, layout.root)
    script = spec.script
    if script is not None:
        return Command(_script_argv(script, spec.interpreter, user_args), layout.code_dir)
    if spec.image_command is not None:  # as SageMaker runs an image: its entry point, with `train`
        return Command(spec.image_command, Path(spec.image_workdir or "/"))
    raise NoCommand(_no_command_message(spec))


def _with_interpreter(entrypoint: tuple[str, ...], interpreter: str) -> tuple[str, ...]:
    # In a container `python` is the image's Python; here the fleet file says which one that is.
    if entrypoint[0] in PYTHON_NAMES:
        return (interpreter, *entrypoint[1:])
    return entrypoint


def _script_argv(script: ScriptMode, interpreter: str, user_args: Sequence[str]) -> tuple[str, ...]:
    program = PurePosixPath(script.program)
    if not script.program or program.is_absolute() or ".." in program.parts:
        raise NoCommand(f"sagemaker_program {script.program!r}: must be a path inside the submitted source")
    if not script.submit_directory.startswith("s3://"):
        raise NoCommand(
            f"sagemaker_submit_directory {script.submit_directory!r}: this back end fetches code only from "
            "s3:// URIs (the SageMaker Python SDK uploads source_dir there unless it runs in local mode)"
        )
    # As the training toolkit does: Python programs run under the interpreter, shell scripts under sh,
    # anything else as an executable, always from the code directory.
    if program.suffix == ".py":
        return (interpreter, script.program, *user_args)
    if program.suffix == ".sh":
        return ("/bin/sh", script.program, *user_args)
    return (f"./{script.program}", *user_args)


def _no_command_message(spec: JobSpec) -> str:
    image = f" ({spec.image_uri})" if spec.image_uri else ""
    hint = ""
    _, framework = split_hyperparameters(spec.hyperparameters)
    if PROGRAM_PARAMETER in framework:
        hint = (
            " (sagemaker_program is set but sagemaker_submit_directory is not: the code must be uploaded,"
            " as the SDK does with source_dir)"
        )
    return (
        "this back end runs each instance as a local process and cannot run the image's own entry point"
        f"{image}: set AlgorithmSpecification.ContainerEntrypoint (and ContainerArguments) to the command"
        " to run, or use script mode: hyperparameters sagemaker_program and sagemaker_submit_directory"
        " (an s3:// URI of a sourcedir.tar.gz), as the SageMaker Python SDK sets them from entry_point and"
        f" source_dir{hint}"
    )


# --- the contract ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """Everything one instance is given: its tree, its config files, its variables and its command."""

    layout: Layout
    hyperparameters: dict[str, str]
    resource_config: dict[str, Any]
    input_data_config: dict[str, dict[str, str]]
    environment: dict[str, str]
    """The job's Environment overlaid with the contract's variables (the contract wins)."""
    command: Command
    script: ScriptMode | None = None
    channel_shards: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    def config_files(self) -> dict[Path, Any]:
        """The JSON files of ``input/config`` and what each holds."""
        return {
            self.layout.hyperparameters_file: self.hyperparameters,
            self.layout.resource_config_file: self.resource_config,
            self.layout.input_data_config_file: self.input_data_config,
        }

    def process_environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The variables to start the process with: ``base`` (say PATH, HOME, LANG) under the contract's;
        pass ``{}`` to a back end that supplies its own base (``TaskSpec.env``). In script mode the code
        directory leads PYTHONPATH, so the program can import its neighbours, as in a SageMaker container."""
        merged = {**base, **self.environment}
        if self.script is not None:
            paths = [str(self.layout.code_dir), merged.get("PYTHONPATH", "")]
            merged["PYTHONPATH"] = ":".join(path for path in paths if path)
        return merged


def build_contract(spec: JobSpec, root: Path) -> Contract:
    """The contract of ``spec``'s instance whose tree is under ``root``. Raises :class:`NoCommand` when
    there is nothing to run and :class:`UnsupportedInput` for channels this back end cannot serve."""
    for channel in spec.channels:
        _check_channel(channel)
    for variable, names in channel_variable_clashes([channel.name for channel in spec.channels]).items():
        raise UnsupportedInput(f"channels {' and '.join(map(repr, names))} would both set {variable}")
    layout = Layout(root, spec.checkpoint_local_path)
    user, framework = split_hyperparameters(spec.hyperparameters)
    user_args = hyperparameter_args(user)
    command = build_command(spec, layout, user_args)
    resource_config = _resource_config(spec)
    input_data_config = {channel.name: _channel_config(channel) for channel in spec.channels}
    variables = _sm_variables(spec, layout, user, framework, user_args, resource_config, input_data_config)
    return Contract(
        layout=layout,
        hyperparameters=dict(spec.hyperparameters),
        resource_config=resource_config,
        input_data_config=input_data_config,
        environment={**spec.environment, **variables},
        command=command,
        script=spec.script,
        channel_shards={channel.name: _shard(channel, spec) for channel in spec.channels},
    )


def _check_channel(channel: Channel) -> None:
    problem = channel_name_problem(channel.name)
    if problem is not None:
        raise UnsupportedInput(f"channel {channel.name!r}: {problem}")
    if channel.input_mode not in SERVED_INPUT_MODES:
        raise UnsupportedInput(
            f"channel {channel.name!r}: TrainingInputMode {channel.input_mode} is not served by this"
            " back end; use File or FastFile"
        )
    if channel.data_type != "S3Prefix":
        raise UnsupportedInput(
            f"channel {channel.name!r}: S3DataType {channel.data_type} is not served by this back end;"
            " use S3Prefix"
        )


def _shard(channel: Channel, spec: JobSpec) -> tuple[int, int] | None:
    if channel.distribution != "ShardedByS3Key" or spec.instance_count == 1:
        return None
    return (spec.hosts.index(spec.current_host), spec.instance_count)


def _resource_config(spec: JobSpec) -> dict[str, Any]:
    return {
        "current_host": spec.current_host,
        "current_instance_type": spec.instance_type,
        "current_group_name": INSTANCE_GROUP,
        "hosts": list(spec.hosts),
        "instance_groups": [
            {
                "instance_group_name": INSTANCE_GROUP,
                "instance_type": spec.instance_type,
                "hosts": list(spec.hosts),
            }
        ],
        "network_interface_name": spec.network_interface_name,
    }


def _channel_config(channel: Channel) -> dict[str, str]:
    config = {
        "TrainingInputMode": channel.input_mode,
        "S3DistributionType": channel.distribution,
        "RecordWrapperType": "None",
    }
    if channel.content_type:
        config["ContentType"] = channel.content_type
    return config


def _sm_variables(
    spec: JobSpec,
    layout: Layout,
    user: Mapping[str, Any],
    framework: Mapping[str, Any],
    user_args: Sequence[str],
    resource_config: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
) -> dict[str, str]:
    """The toolkit's ``SM_*`` variables, built from ``SM_TRAINING_ENV``'s values, plus hyperplan's own."""
    channel_dirs = {channel.name: str(layout.channel_dir(channel.name)) for channel in spec.channels}
    script = spec.script
    training_env: dict[str, Any] = {
        "additional_framework_parameters": dict(framework),
        "channel_input_dirs": channel_dirs,
        "current_host": spec.current_host,
        "current_instance_group": INSTANCE_GROUP,
        "current_instance_type": spec.instance_type,
        "hosts": list(spec.hosts),
        "hyperparameters": dict(user),
        "input_config_dir": str(layout.input_config_dir),
        "input_data_config": dict(input_data_config),
        "input_dir": str(layout.input_dir),
        "is_master": spec.current_host == spec.hosts[0],
        "job_name": spec.job_name,
        "log_level": framework.get(LOG_LEVEL_PARAMETER, 20),
        "master_hostname": spec.hosts[0],
        "model_dir": str(layout.model_dir),
        "module_dir": script.submit_directory if script else str(layout.code_dir),
        "module_name": script.program.removesuffix(".py") if script else None,
        "network_interface_name": spec.network_interface_name,
        "num_cpus": spec.cpu_count,
        "num_gpus": 0,
        "num_neurons": 0,
        "output_data_dir": str(layout.output_data_dir),
        "output_dir": str(layout.output_dir),
        "output_intermediate_dir": str(layout.output_intermediate_dir),
        "resource_config": dict(resource_config),
        "user_entry_point": script.program if script else None,
    }
    variables = {
        f"SM_{name.upper()}": env_text(training_env[name])
        for name in (
            "hosts", "current_host", "current_instance_type", "current_instance_group",
            "network_interface_name", "model_dir", "input_dir", "input_config_dir", "output_dir",
            "output_data_dir", "output_intermediate_dir", "num_cpus", "num_gpus", "num_neurons",
            "log_level", "resource_config", "input_data_config", "module_dir",
        )
    }  # fmt: skip
    if script is not None:
        variables["SM_USER_ENTRY_POINT"] = script.program
        variables["SM_MODULE_NAME"] = training_env["module_name"]
    variables |= {
        "SM_HPS": env_text(dict(user)),
        "SM_FRAMEWORK_PARAMS": env_text(dict(framework)),
        "SM_USER_ARGS": env_text(list(user_args)),
        "SM_CHANNELS": env_text(sorted(channel_dirs)),
        "SM_TRAINING_ENV": env_text(training_env),
        "SM_CHECKPOINT_DIR": str(layout.checkpoint_dir),
        "SAGEMAKER_BASE_DIR": str(layout.root),
        "TRAINING_JOB_NAME": spec.job_name,
        CAPACITY_EXPIRATION_VARIABLE: str(int(spec.segment_end_epoch or 0)),
    }
    variables |= {env_name("SM_CHANNEL_", name): path for name, path in channel_dirs.items()}
    variables |= {env_name("SM_HP_", name): env_text(value) for name, value in sorted(user.items())}
    return variables


def env_name(prefix: str, name: str) -> str:
    """``SM_HP_`` + ``learning-rate`` -> ``SM_HP_LEARNING_RATE``. The toolkit only upper-cases the name;
    here anything but a letter, digit or ``_`` also becomes ``_``, so that every variable can be named
    in a shell (and passes the back ends' checks). The exact names stay in SM_HPS and SM_CHANNELS."""
    return prefix + re.sub(r"[^A-Z0-9_]", "_", name.upper())
