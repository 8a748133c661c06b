#!/usr/bin/python3
"""``train``: the SageMaker training toolkit's contract, in a Python image built on Debian's python3.

SageMaker starts a training image as ``docker run IMAGE train``. This program, installed as
``/usr/local/bin/train`` by ``scripts/image-dev build --sagemaker``, does what the training toolkit does
in script mode (the rules hyperplan follows for host processes, hyperplan/training/contract.py):

- reads ``/opt/ml/input/config/hyperparameters.json`` (string values, as SageMaker writes them), decoding
  each value that is JSON (the SDK JSON-encodes every one) and keeping any other as the string;
  ``resourceconfig.json`` and ``inputdataconfig.json`` when they are there;
- runs ``sagemaker_program`` from ``/opt/ml/code`` (``.py`` under this Python, ``.sh`` under sh, anything
  else as an executable) with the user's hyperparameters (those not named ``sagemaker_*``) as ``--name
  value`` arguments in name order, and the ``SM_*`` variables: ``SM_MODEL_DIR=/opt/ml/model``,
  ``SM_CHANNEL_<NAME>``, ``SM_HPS``, ``SM_HP_<NAME>``, ``SM_OUTPUT_DATA_DIR``, ``SM_TRAINING_ENV``, ...;
- on failure writes why to ``/opt/ml/output/failure`` (SageMaker's FailureReason) and exits non-zero:
  the program's own exit code (128 + N when signal N ended it), or 1 when there was nothing to run.

``SAGEMAKER_BASE_DIR``, when set, stands for ``/opt/ml``, as in the toolkit.

In a container this is process 1, so it does process 1's two duties itself and the image needs no
``--init``: SIGTERM and SIGINT are passed on to the program (the kernel spares process 1 from signals
it does not handle, so SageMaker's SIGTERM at StopTrainingJob would otherwise be lost), and every child
that ends is reaped, the program's orphans included (a data loader's workers whose parent died, a
daemon it started), which would otherwise stay as zombies until the container ends. Run with
``--init`` it is the init's child and the same code does no harm.

It uses the standard library alone and imports nothing of hyperplan, which is not in the image.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

DEFAULT_BASE = "/opt/ml"
FRAMEWORK_PREFIX = "sagemaker_"
PROGRAM_PARAMETER = "sagemaker_program"
SUBMIT_DIR_PARAMETER = "sagemaker_submit_directory"
LOG_LEVEL_PARAMETER = "sagemaker_container_log_level"
INSTANCE_GROUP = "homogeneousCluster"
STDERR_LINES = 20  # the end of the program's stderr that goes into the failure file
STDERR_GRACE = 2.0  # seconds to wait, once the program has ended, for what it left holding its stderr


class TrainError(Exception):
    """Nothing to run, or a config file that cannot be read: written to the failure file, exit 1."""


# -- the toolkit's rules (hyperplan/training/contract.py) -----------------------------------------------


def decode_value(text: Any) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return text


def hyperparameter_args(user: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for name in sorted(user):
        value = user[name]
        args.append(f"--{name}" if len(name) > 1 else f"-{name}")
        if isinstance(value, Mapping):
            args.append(",".join(f"{key}={item}" for key, item in sorted(value.items())))
        else:
            args.append("" if value is None else str(value))
    return args


def env_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def env_name(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^A-Z0-9_]", "_", name.upper())


# -- the run --------------------------------------------------------------------------------------------


class Paths:
    """``/opt/ml`` (or SAGEMAKER_BASE_DIR) and the directories of the contract under it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.input = base / "input"
        self.input_config = self.input / "config"
        self.input_data = self.input / "data"
        self.model = base / "model"
        self.output = base / "output"
        self.output_data = self.output / "data"
        self.output_intermediate = self.output / "intermediate"
        self.failure = self.output / "failure"
        self.code = base / "code"


def read_config(paths: Paths, name: str, default: Any) -> Any:
    path = paths.input_config / name
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise TrainError(f"cannot read {path}: {error}") from None


def channel_names(paths: Paths, input_data_config: Mapping[str, Any]) -> list[str]:
    """The channels inputdataconfig.json names; without that file, the directories under input/data."""
    if input_data_config:
        return sorted(input_data_config)
    try:
        return sorted(entry.name for entry in paths.input_data.iterdir() if entry.is_dir())
    except OSError:
        return []


def gpu_count() -> int:
    return sum(1 for device in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", device.name))


def environment(paths: Paths, hyperparameters: Any) -> tuple[dict[str, str], list[str], str]:
    """The variables of the toolkit, the program's arguments, and the program."""
    if not isinstance(hyperparameters, Mapping):
        raise TrainError(f"{paths.input_config}/hyperparameters.json does not hold a JSON object")
    decoded = {name: decode_value(value) for name, value in hyperparameters.items()}
    user = {name: value for name, value in decoded.items() if not name.startswith(FRAMEWORK_PREFIX)}
    framework = {name: value for name, value in decoded.items() if name.startswith(FRAMEWORK_PREFIX)}
    program = framework.get(PROGRAM_PARAMETER)
    if not program:
        raise TrainError(f"no {PROGRAM_PARAMETER} in hyperparameters.json: nothing to run")
    user_args = hyperparameter_args(user)
    settings = training_environment(paths, user, framework, str(program))
    return sm_variables(settings, user_args), user_args, str(program)


def training_environment(
    paths: Paths, user: dict[str, Any], framework: dict[str, Any], program: str
) -> dict[str, Any]:
    """What the toolkit puts in SM_TRAINING_ENV, from the config files and the hyperparameters."""
    default_resources = {"current_host": "algo-1", "hosts": ["algo-1"]}  # a run outside SageMaker
    resource_config = read_config(paths, "resourceconfig.json", default_resources)
    input_data_config = read_config(paths, "inputdataconfig.json", {})
    for name, config in (
        ("resourceconfig.json", resource_config),
        ("inputdataconfig.json", input_data_config),
    ):
        if not isinstance(config, dict):
            raise TrainError(f"{paths.input_config}/{name} does not hold a JSON object")
    hosts = list(resource_config.get("hosts") or ["algo-1"])
    current_host = resource_config.get("current_host", hosts[0])
    return {
        "additional_framework_parameters": framework,
        "channel_input_dirs": {
            name: str(paths.input_data / name) for name in channel_names(paths, input_data_config)
        },
        "current_host": current_host,
        "current_instance_group": resource_config.get("current_group_name", INSTANCE_GROUP),
        "current_instance_type": resource_config.get("current_instance_type", "local"),
        "hosts": hosts,
        "hyperparameters": user,
        "input_config_dir": str(paths.input_config),
        "input_data_config": input_data_config,
        "input_dir": str(paths.input),
        "is_master": current_host == hosts[0],
        "job_name": os.environ.get("TRAINING_JOB_NAME"),
        "log_level": framework.get(LOG_LEVEL_PARAMETER, 20),
        "master_hostname": hosts[0],
        "model_dir": str(paths.model),
        "module_dir": str(framework.get(SUBMIT_DIR_PARAMETER, paths.code)),
        "module_name": program.removesuffix(".py"),
        "network_interface_name": resource_config.get("network_interface_name", "eth0"),
        "num_cpus": len(os.sched_getaffinity(0)),
        "num_gpus": gpu_count(),
        "num_neurons": 0,
        "output_data_dir": str(paths.output_data),
        "output_dir": str(paths.output),
        "output_intermediate_dir": str(paths.output_intermediate),
        "resource_config": resource_config,
        "user_entry_point": program,
    }


def sm_variables(settings: dict[str, Any], user_args: list[str]) -> dict[str, str]:
    """The SM_* variables of SM_TRAINING_ENV's settings, as the toolkit names them."""
    user, channels = settings["hyperparameters"], settings["channel_input_dirs"]
    variables = {
        f"SM_{name.upper()}": env_text(settings[name])
        for name in (
            "hosts", "current_host", "current_instance_type", "current_instance_group",
            "network_interface_name", "model_dir", "input_dir", "input_config_dir", "output_dir",
            "output_data_dir", "output_intermediate_dir", "num_cpus", "num_gpus", "num_neurons",
            "log_level", "resource_config", "input_data_config", "module_dir", "module_name",
            "user_entry_point",
        )
    }  # fmt: skip
    variables |= {
        "SM_HPS": env_text(user),
        "SM_FRAMEWORK_PARAMS": env_text(settings["additional_framework_parameters"]),
        "SM_USER_ARGS": env_text(user_args),
        "SM_CHANNELS": env_text(sorted(channels)),
        "SM_TRAINING_ENV": env_text(settings),
    }
    variables |= {env_name("SM_CHANNEL_", name): path for name, path in channels.items()}
    variables |= {env_name("SM_HP_", name): env_text(value) for name, value in sorted(user.items())}
    return variables


def command(paths: Paths, program: str, user_args: list[str]) -> list[str]:
    if not program or program.startswith("/") or ".." in program.split("/"):
        raise TrainError(f"{PROGRAM_PARAMETER} {program!r}: must be a path inside {paths.code}")
    if not (paths.code / program).is_file():
        raise TrainError(f"{PROGRAM_PARAMETER} {program!r}: no such file in {paths.code}")
    if program.endswith(".py"):
        return [sys.executable, program, *user_args]
    if program.endswith(".sh"):
        return ["/bin/sh", program, *user_args]
    return [f"./{program}", *user_args]


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run the program, its stderr copied through as it comes, reaping every child that ends until the
    program has; its exit code and the end of its stderr."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stderr=subprocess.PIPE)

    def forward(number: int, _frame: object) -> None:
        if process.returncode is None:  # not reaped yet, so its pid is still its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, number)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    last: deque[str] = deque(maxlen=STDERR_LINES)
    assert process.stderr is not None
    copier = threading.Thread(target=_copy_stderr, args=(process.stderr, last), daemon=True)
    copier.start()
    code = None
    while code is None:
        try:
            pid, status = os.waitpid(-1, 0)  # the program, or an orphan given to this process 1
        except ChildProcessError:  # nothing left to wait for: cannot happen while the program is ours
            code = process.wait()
            break
        if pid == process.pid:
            code = process.returncode = os.waitstatus_to_exitcode(status)
    # What the program left running may hold its stderr open: wait a moment for the end, not for them.
    copier.join(STDERR_GRACE)
    return (128 - code if code < 0 else code), list(last)


def _copy_stderr(stderr: IO[bytes], last: deque[str]) -> None:
    for line in stderr:
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
        last.append(line.decode(errors="replace").rstrip("\n"))


def write_failure(paths: Paths, message: str) -> None:
    try:
        paths.output.mkdir(parents=True, exist_ok=True)
        paths.failure.write_text(message, encoding="utf-8")
    except OSError as error:
        print(f"train: cannot write {paths.failure}: {error}", file=sys.stderr)


def main() -> int:
    paths = Paths(Path(os.environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE).absolute())
    try:
        hyperparameters = read_config(paths, "hyperparameters.json", {})
        variables, user_args, program = environment(paths, hyperparameters)
        argv = command(paths, program, user_args)
    except TrainError as error:
        write_failure(paths, f"AlgorithmError: {error}\n")
        print(f"train: {error}", file=sys.stderr)
        return 1
    for directory in (paths.model, paths.output_data, paths.output_intermediate):
        directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **variables}
    env["PYTHONPATH"] = ":".join(p for p in (str(paths.code), os.environ.get("PYTHONPATH", "")) if p)
    code, stderr = run(argv, paths.code, env)
    if code != 0:
        message = "\n".join(stderr)
        write_failure(
            paths,
            f'ExecuteUserScriptError:\nExitCode {code}\nErrorMessage "{message}"\n'
            f'Command "{" ".join(argv)}"\n',
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
