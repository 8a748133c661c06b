"""The images' `train` program (hyperplan/containers/sagemaker_train.py), run here on the host's Python
against a tree made under SAGEMAKER_BASE_DIR: it follows the same rules as the contract hyperplan gives
host processes (hyperplan/training/contract.py), passes SIGTERM on and does not wait on what the program
leaves running. tests/containers runs it in the image itself, as process 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hyperplan.containers.image_build import TRAIN_PROGRAM
from hyperplan.training.contract import Channel, JobSpec, build_contract, host_names

HYPERPARAMETERS = {
    "sagemaker_program": '"fit.py"',
    "sagemaker_submit_directory": '"s3://b/code/sourcedir.tar.gz"',
    "sagemaker_container_log_level": "10",
    "epochs": "3",
    "learning-rate": "1e-3",
    "k": "5",
    "layers": '{"depth": 4, "kinds": ["conv", "dense"], "bias": true, "drop": null}',
    "title": '"caf\\u00e9 \\u2603 \\ud83d\\ude00 \\"quoted\\"\\n"',
    "plain": "not JSON at all",
    "empty": '""',
    "nothing": "null",
    "big": "123456789012345678901234567890",
    "tiny": "-2.5E-7",
}

# The user's program: what it was given, as JSON (the host's Python has the json module).
RECORDER = """
import json, os, sys
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as out:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}, out)
"""


def make_tree(root: Path, config_files: dict[str, object], program: str = RECORDER) -> None:
    """input/config/NAME for each of `config_files`, and code/fit.py."""
    (root / "input" / "config").mkdir(parents=True)
    for name, content in config_files.items():
        (root / "input" / "config" / name).write_text(json.dumps(content))
    (root / "code").mkdir()
    (root / "code" / "fit.py").write_text(program)


def train_environment(root: Path, **env: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "SAGEMAKER_BASE_DIR": str(root), **env}


def run_train(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRAIN_PROGRAM)],
        env=train_environment(root, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def job(hyperparameters: dict[str, str]) -> JobSpec:
    return JobSpec(
        job_name="j1",
        instance_type="ml.g5.12xlarge",
        hosts=host_names(2),
        current_host="algo-2",
        output_path="s3://out/models",
        hyperparameters=hyperparameters,
        channels=(
            Channel("train", "s3://b/data/train", content_type="text/csv"),
            Channel("validation-data", "s3://b/data/val", input_mode="FastFile"),
        ),
        cpu_count=len(os.sched_getaffinity(0)),
        network_interface_name="eth0",
    )


def test_train_gives_the_program_what_the_contract_gives_a_host_process(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    contract = build_contract(job(HYPERPARAMETERS), root)
    make_tree(root, {path.name: content for path, content in contract.config_files().items()})
    result = run_train(root, TRAINING_JOB_NAME="j1")
    assert result.returncode == 0, result.stderr
    seen = json.loads((root / "model" / "seen.json").read_text())

    assert seen["argv"] == list(contract.command.argv[2:])  # after the interpreter and the program
    assert seen["argv"][:4] == ["--big", "123456789012345678901234567890", "--empty", ""]
    assert seen["cwd"] == str(root / "code")
    # Every SM_ variable of the contract but hyperplan's own SM_CHECKPOINT_DIR, and the counts of this
    # machine's processors and GPUs, which train counts itself.
    machine = {"SM_NUM_CPUS", "SM_NUM_GPUS", "SM_TRAINING_ENV"}
    expected = {
        name: value
        for name, value in contract.environment.items()
        if name.startswith("SM_") and name != "SM_CHECKPOINT_DIR" and name not in machine
    }
    given = {
        name: value for name, value in seen["env"].items() if name.startswith("SM_") and name not in machine
    }
    assert given == expected
    assert json.loads(given["SM_HPS"])["title"] == 'café ☃ 😀 "quoted"\n'
    assert given["SM_HP_LEARNING_RATE"] == "0.001"
    assert given["SM_CHANNEL_VALIDATION_DATA"] == str(root / "input" / "data" / "validation-data")

    training_env = json.loads(seen["env"]["SM_TRAINING_ENV"])
    contract_env = json.loads(contract.environment["SM_TRAINING_ENV"])
    assert training_env["num_cpus"] == contract_env["num_cpus"]
    for counted in ("num_gpus", "num_cpus"):
        training_env.pop(counted), contract_env.pop(counted)
    assert training_env == contract_env
    assert seen["env"]["PYTHONPATH"].split(":")[0] == str(root / "code")
    assert not (root / "output" / "failure").exists()


def test_a_failing_program_leaves_its_exit_code_and_its_last_words_in_the_failure_file(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ml"
    failing = "import sys\nprint('loss is NaN at step 7', file=sys.stderr)\nsys.exit(3)\n"
    make_tree(root, {"hyperparameters.json": {"sagemaker_program": '"fit.py"', "epochs": "2"}}, failing)
    result = run_train(root)
    assert result.returncode == 3
    assert "loss is NaN at step 7" in result.stderr  # passed through as it came
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("ExecuteUserScriptError:\nExitCode 3\n")
    assert 'ErrorMessage "loss is NaN at step 7"' in failure
    assert "fit.py --epochs 2" in failure


def test_without_a_program_train_says_so_in_the_failure_file(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    make_tree(root, {"hyperparameters.json": {"epochs": "2"}})
    result = run_train(root)
    assert result.returncode == 1
    assert (root / "output" / "failure").read_text() == (
        "AlgorithmError: no sagemaker_program in hyperparameters.json: nothing to run\n"
    )
    (root / "input" / "config" / "hyperparameters.json").write_text('{"sagemaker_program": "\\"gone.py\\""}')
    assert run_train(root).returncode == 1
    assert "'gone.py': no such file in" in (root / "output" / "failure").read_text()


# Says it is ready, then on SIGTERM saves what it can and exits 7.
STOPPABLE = """
import os, signal, sys, time
def stop(number, frame):
    print("stopping: checkpoint saved", file=sys.stderr)
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(os.environ["SM_MODEL_DIR"], "ready"), "w").close()
time.sleep(60)
"""


def test_sigterm_reaches_the_program_and_its_exit_code_is_train_s(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    make_tree(root, {"hyperparameters.json": {"sagemaker_program": '"fit.py"'}}, STOPPABLE)
    with subprocess.Popen(
        [sys.executable, str(TRAIN_PROGRAM)],
        env=train_environment(root),
        stderr=subprocess.PIPE,
        text=True,
    ) as train:
        try:
            deadline = time.monotonic() + 30
            while not (root / "model" / "ready").exists():
                assert train.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            train.send_signal(signal.SIGTERM)
            assert train.wait(timeout=30) == 7
        finally:
            train.kill()
        assert train.stderr is not None
        assert "stopping: checkpoint saved" in train.stderr.read()
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("ExecuteUserScriptError:\nExitCode 7\n")
    assert 'ErrorMessage "stopping: checkpoint saved"' in failure


# Leaves a process behind that holds its stderr, and says which.
LEAVES_ONE_RUNNING = """
import os, subprocess, sys
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], "left.pid"), "w") as out:
    out.write(str(left.pid))
print("trained", file=sys.stderr)
"""


def test_train_ends_with_the_program_even_if_it_left_a_process_holding_its_stderr(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    make_tree(root, {"hyperparameters.json": {"sagemaker_program": '"fit.py"'}}, LEAVES_ONE_RUNNING)
    said = tmp_path / "stderr"  # a file: a pipe would stay open here as long as the left process lives
    try:
        with said.open("w") as stderr:
            train = subprocess.run(
                [sys.executable, str(TRAIN_PROGRAM)], env=train_environment(root), stderr=stderr, timeout=30
            )  # not the left process's 60 s
        assert train.returncode == 0, said.read_text()
        assert "trained" in said.read_text()
    finally:
        left = root / "model" / "left.pid"
        if left.exists():
            os.kill(int(left.read_text()), signal.SIGKILL)
