"""The training contract as values: config files, variables and the command, for a few kinds of job."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from hyperplan.training.contract import (
    CAPACITY_EXPIRATION_VARIABLE,
    Channel,
    JobSpec,
    Layout,
    NoCommand,
    UnsupportedInput,
    build_contract,
    host_names,
    hyperparameter_args,
    rebased,
)

ROOT = Path("/var/lib/hyperplan/jobs/j1/algo-1")
SDK_HYPERPARAMETERS = {
    "sagemaker_program": '"train.py"',
    "sagemaker_submit_directory": '"s3://b/code/sourcedir.tar.gz"',
    "epochs": "3",
    "lr": "0.1",
}


def two_host_spec(current_host: str, **changes: object) -> JobSpec:
    spec = JobSpec(
        job_name="j1",
        instance_type="ml.p5.48xlarge",
        hosts=host_names(2),
        current_host=current_host,
        output_path="s3://out/models",
        hyperparameters={"epochs": "3", "name": "plain text"},
        channels=(
            Channel("training", "s3://b/data/train", content_type="text/csv"),
            Channel("validation", "s3://b/data/val", input_mode="FastFile"),
        ),
        environment={"MY_SETTING": "1", "SM_NUM_GPUS": "8"},
        checkpoint_uri="s3://b/ckpt/j1",
        segment_end_epoch=1_760_000_000,
        entrypoint=("python", "/shared/train.py"),
        arguments=("--fast",),
        interpreter="/opt/py/bin/python3",
        cpu_count=4,
    )
    return replace(spec, **changes)  # type: ignore[arg-type]


def test_a_two_host_job_gives_each_host_both_names_and_its_own() -> None:
    for host in ("algo-1", "algo-2"):
        env = build_contract(two_host_spec(host), ROOT).environment
        assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
        assert env["SM_CURRENT_HOST"] == host
        assert json.loads(env["SM_RESOURCE_CONFIG"])["current_host"] == host
        assert json.loads(env["SM_TRAINING_ENV"])["is_master"] == (host == "algo-1")


def test_config_files_follow_sagemaker() -> None:
    contract = build_contract(two_host_spec("algo-2"), ROOT)
    files = {path.relative_to(ROOT).as_posix(): content for path, content in contract.config_files().items()}
    assert files["input/config/hyperparameters.json"] == {"epochs": "3", "name": "plain text"}
    assert files["input/config/resourceconfig.json"] == {
        "current_host": "algo-2",
        "current_instance_type": "ml.p5.48xlarge",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": "ml.p5.48xlarge",
                "hosts": ["algo-1", "algo-2"],
            }
        ],
        "network_interface_name": "lo",
    }
    assert files["input/config/inputdataconfig.json"] == {
        "training": {
            "ContentType": "text/csv",
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        },
        "validation": {
            "TrainingInputMode": "FastFile",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        },
    }


def test_every_path_variable_points_under_the_root() -> None:
    env = build_contract(two_host_spec("algo-1"), ROOT).environment
    expected = {
        "SAGEMAKER_BASE_DIR": "",
        "SM_MODEL_DIR": "model",
        "SM_INPUT_DIR": "input",
        "SM_INPUT_CONFIG_DIR": "input/config",
        "SM_OUTPUT_DIR": "output",
        "SM_OUTPUT_DATA_DIR": "output/data",
        "SM_OUTPUT_INTERMEDIATE_DIR": "output/intermediate",
        "SM_CHANNEL_TRAINING": "input/data/training",
        "SM_CHANNEL_VALIDATION": "input/data/validation",
        "SM_CHECKPOINT_DIR": "checkpoints",
    }
    for name, relative in expected.items():
        assert env[name] == str(ROOT / relative), name
    assert not [name for name, value in env.items() if "/opt/ml" in value]


def test_the_job_and_its_hyperparameters_are_in_the_environment() -> None:
    env = build_contract(two_host_spec("algo-1"), ROOT).environment
    assert env["TRAINING_JOB_NAME"] == "j1"
    assert env[CAPACITY_EXPIRATION_VARIABLE] == "1760000000"
    assert env["SM_CHANNELS"] == '["training","validation"]'
    assert env["SM_HPS"] == '{"epochs":3,"name":"plain text"}'
    assert env["SM_HP_EPOCHS"] == "3"
    assert env["SM_HP_NAME"] == "plain text"
    assert env["SM_USER_ARGS"] == '["--epochs","3","--name","plain text"]'
    assert env["SM_NUM_CPUS"] == "4"
    assert env["SM_NUM_GPUS"] == "0"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.p5.48xlarge"
    assert env["MY_SETTING"] == "1"  # the job's own Environment
    assert env["SM_NUM_GPUS"] == "0"  # ... under the contract's variables
    assert "SM_USER_ENTRY_POINT" not in env
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["channel_input_dirs"]["training"] == str(ROOT / "input/data/training")
    assert training_env["hyperparameters"] == {"epochs": 3, "name": "plain text"}


def test_variable_names_are_valid_shell_names() -> None:
    channels = (Channel("train-data.v2", "s3://b/t"),)
    spec = two_host_spec("algo-1", hyperparameters={"learning-rate": "0.1", "a.b c": "x"}, channels=channels)
    env = build_contract(spec, ROOT).environment
    assert env["SM_HP_LEARNING_RATE"] == "0.1"
    assert env["SM_HP_A_B_C"] == "x"
    assert env["SM_CHANNEL_TRAIN_DATA_V2"] == str(ROOT / "input/data/train-data.v2")
    assert json.loads(env["SM_HPS"]) == {"learning-rate": 0.1, "a.b c": "x"}
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in env)


def test_without_a_segment_the_expiration_is_zero() -> None:
    env = build_contract(two_host_spec("algo-1", segment_end_epoch=None), ROOT).environment
    assert env[CAPACITY_EXPIRATION_VARIABLE] == "0"


def test_an_entrypoint_runs_as_given_with_python_meaning_the_images_interpreter() -> None:
    command = build_contract(two_host_spec("algo-1"), ROOT).command
    assert command.argv == ("/opt/py/bin/python3", "/shared/train.py", "--fast")
    assert command.cwd == ROOT
    other = build_contract(
        two_host_spec("algo-1", entrypoint=("/bin/echo", "hi"), arguments=()), ROOT
    ).command
    assert other.argv == ("/bin/echo", "hi")


def test_script_mode_runs_the_program_with_the_hyperparameters_as_arguments() -> None:
    spec = two_host_spec("algo-1", entrypoint=(), arguments=(), hyperparameters=SDK_HYPERPARAMETERS)
    contract = build_contract(spec, ROOT)
    code = ROOT / "code"
    assert contract.command.argv == ("/opt/py/bin/python3", "train.py", "--epochs", "3", "--lr", "0.1")
    assert contract.command.cwd == code
    assert contract.hyperparameters == SDK_HYPERPARAMETERS  # hyperparameters.json: as sent
    env = contract.environment
    assert env["SM_HPS"] == '{"epochs":3,"lr":0.1}'
    assert env["SM_HP_EPOCHS"] == "3"
    assert env["SM_HP_LR"] == "0.1"
    assert "SM_HP_SAGEMAKER_PROGRAM" not in env
    assert env["SM_USER_ARGS"] == '["--epochs","3","--lr","0.1"]'
    assert env["SM_USER_ENTRY_POINT"] == "train.py"
    assert env["SM_MODULE_NAME"] == "train"
    assert env["SM_MODULE_DIR"] == "s3://b/code/sourcedir.tar.gz"
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == {
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": "s3://b/code/sourcedir.tar.gz",
    }
    process_env = contract.process_environment({"PATH": "/usr/bin", "PYTHONPATH": "/site"})
    assert process_env["PYTHONPATH"] == f"{code}:/site"
    assert process_env["PATH"] == "/usr/bin"


@pytest.mark.parametrize(
    ("program", "argv"),
    [
        ("run.sh", ("/bin/sh", "run.sh", "--epochs", "3", "--lr", "0.1")),
        ("bin/train", ("./bin/train", "--epochs", "3", "--lr", "0.1")),
    ],
)
def test_script_mode_runs_shell_scripts_and_executables_too(program: str, argv: tuple[str, ...]) -> None:
    hyperparameters = {**SDK_HYPERPARAMETERS, "sagemaker_program": json.dumps(program)}
    spec = two_host_spec("algo-1", entrypoint=(), hyperparameters=hyperparameters)
    assert build_contract(spec, ROOT).command.argv == argv


def test_an_entrypoint_wins_over_script_mode() -> None:
    spec = two_host_spec("algo-1", hyperparameters=SDK_HYPERPARAMETERS)
    assert build_contract(spec, ROOT).command.argv[1] == "/shared/train.py"


def test_hyperparameter_arguments_mirror_the_training_toolkit() -> None:
    decoded = {
        "b": True,
        "lr": 0.001,
        "layers": [1, 2],
        "opts": {"z": 1, "a": "x"},
        "name": "n",
        "none": None,
    }
    assert hyperparameter_args(decoded) == [
        "-b", "True",
        "--layers", "[1, 2]",
        "--lr", "0.001",
        "--name", "n",
        "--none", "",
        "--opts", "a=x,z=1",
    ]  # fmt: skip


def test_no_command_says_what_this_back_end_needs() -> None:
    spec = two_host_spec("algo-1", entrypoint=(), arguments=(), image_uri="123.dkr.ecr/img:1")
    with pytest.raises(NoCommand) as caught:
        build_contract(spec, ROOT)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "123.dkr.ecr/img:1" in message
    assert "set AlgorithmSpecification.ContainerEntrypoint (and ContainerArguments)" in message
    assert (
        "script mode" in message
        and "sagemaker_program" in message
        and "sagemaker_submit_directory" in message
    )


def test_no_command_explains_a_program_without_its_code() -> None:
    spec = two_host_spec("algo-1", entrypoint=(), hyperparameters={"sagemaker_program": '"train.py"'})
    with pytest.raises(NoCommand, match="sagemaker_program is set but sagemaker_submit_directory is not"):
        build_contract(spec, ROOT)


@pytest.mark.parametrize(
    ("program", "submit", "complaint"),
    [
        ("../../bin/evil.py", "s3://b/code.tar.gz", "must be a path inside the submitted source"),
        ("/abs/train.py", "s3://b/code.tar.gz", "must be a path inside the submitted source"),
        ("train.py", "file:///home/me/code", "only from s3:// URIs"),
    ],
)
def test_bad_script_mode_settings_are_refused(program: str, submit: str, complaint: str) -> None:
    hyperparameters = {
        "sagemaker_program": json.dumps(program),
        "sagemaker_submit_directory": json.dumps(submit),
    }
    with pytest.raises(NoCommand, match=complaint):
        build_contract(two_host_spec("algo-1", entrypoint=(), hyperparameters=hyperparameters), ROOT)


def test_pipe_mode_and_manifests_are_refused() -> None:
    with pytest.raises(UnsupportedInput, match="TrainingInputMode Pipe"):
        build_contract(
            two_host_spec("algo-1", channels=(Channel("train", "s3://b/t", input_mode="Pipe"),)), ROOT
        )
    manifest = Channel("train", "s3://b/m.json", data_type="ManifestFile")
    with pytest.raises(UnsupportedInput, match="S3DataType ManifestFile"):
        build_contract(two_host_spec("algo-1", channels=(manifest,)), ROOT)


def test_sharded_channels_give_each_host_its_share() -> None:
    channel = Channel("train", "s3://b/t", distribution="ShardedByS3Key")
    shards = [
        build_contract(two_host_spec(h, channels=(channel,)), ROOT).channel_shards for h in host_names(2)
    ]
    assert shards == [{"train": (0, 2)}, {"train": (1, 2)}]


def test_checkpoint_paths_are_rebased_under_the_root() -> None:
    assert str(rebased("/opt/ml/checkpoints")) == "checkpoints"
    assert str(rebased("/data/ckpt")) == "data/ckpt"
    with pytest.raises(ValueError, match=r"'\.\.'"):
        rebased("/opt/ml/../../etc")
    contract = build_contract(two_host_spec("algo-1", checkpoint_local_path="/data/ckpt"), ROOT)
    assert contract.environment["SM_CHECKPOINT_DIR"] == str(ROOT / "data/ckpt")


def test_the_current_host_must_be_one_of_the_hosts() -> None:
    with pytest.raises(ValueError, match="algo-3"):
        two_host_spec("algo-3")


@pytest.mark.parametrize("name", [".", "..", "a/b", "../config"])
def test_a_channel_must_be_one_directory_of_input_data(name: str) -> None:
    with pytest.raises(UnsupportedInput, match=f"channel {re.escape(repr(name))}"):
        build_contract(two_host_spec("algo-1", channels=(Channel(name, "s3://b/t"),)), ROOT)
    with pytest.raises(ValueError, match="channel"):
        Layout(ROOT).channel_dir(name)


def test_channels_whose_variables_would_clash_are_refused() -> None:
    clashing = (Channel("train-data", "s3://b/t"), Channel("train.data", "s3://b/u"))
    with pytest.raises(UnsupportedInput, match="would both set SM_CHANNEL_TRAIN_DATA"):
        build_contract(two_host_spec("algo-1", channels=clashing), ROOT)


INSIDE = Path("/opt/ml")


def test_in_a_container_the_variables_name_opt_ml_and_the_checkpoints_their_own_path() -> None:
    spec = two_host_spec("algo-1", checkpoint_local_path="/data/ckpt")
    inside = build_contract(spec, INSIDE)
    assert inside.environment["SM_MODEL_DIR"] == "/opt/ml/model"
    assert inside.environment["SM_CHANNEL_TRAINING"] == "/opt/ml/input/data/training"
    assert inside.environment["SM_CHECKPOINT_DIR"] == "/data/ckpt"  # where the job said, not rebased
    assert build_contract(spec, ROOT).layout.checkpoint_dir == ROOT / "data/ckpt"  # on the host: the tree


def test_an_image_without_an_entry_point_or_script_mode_runs_as_sagemaker_runs_it() -> None:
    image_default = ("/usr/bin/entry", "train")
    spec = two_host_spec(
        "algo-1", entrypoint=(), arguments=(), image_command=image_default, image_workdir="/workspace"
    )
    command = build_contract(spec, INSIDE).command
    assert (command.argv, command.cwd) == (image_default, Path("/workspace"))
    scripted = replace(spec, hyperparameters=SDK_HYPERPARAMETERS, interpreter="python3")
    assert build_contract(scripted, INSIDE).command.argv[:2] == ("python3", "train.py")  # script mode wins
