"""`scripts/image-dev build` into a `registry-dev` registry, the images pulled by reference into a clean
Podman store and run there: Python, and the SageMaker-style image's `train` against an /opt/ml tree.

The registry, the builds and the clean store are the session's (tests/containers/conftest.py); each test
reads them and leaves them as they were.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, podman

pytestmark = pytest.mark.containers

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
)
FIT = """
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
arguments = parser.parse_args()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w") as model:
    model.write(f"{arguments.epochs} epochs; SM_HP_EPOCHS={os.environ['SM_HP_EPOCHS']}\\n")
print("trained")
"""
FAILING = """
import sys
print("out of memory at step 12", file=sys.stderr)
sys.exit(3)
"""
# What a team's script may import from the standard library (Debian's python3, not python3-minimal).
STANDARD_LIBRARY = (
    "argparse", "asyncio", "bz2", "csv", "ctypes", "dataclasses", "decimal", "hashlib", "json", "logging",
    "lzma", "multiprocessing", "pathlib", "pickle", "shutil", "sqlite3", "ssl", "subprocess", "tarfile",
    "tempfile", "typing", "urllib.request", "uuid", "zipfile", "zoneinfo",
)  # fmt: skip
# Leaves an orphan that ends (a process whose parent died, as a data loader's worker may be), then
# counts the zombies of the container's process 1 once they are gone or `--wait` seconds have passed:
# none when process 1 reaps what it is given, one when it does not. No sleep decides it: the orphan's
# end is seen as the end of a pipe only it still holds.
ORPHAN = """
import os, sys, time
wait = float(sys.argv[sys.argv.index("--wait") + 1])
read, write = os.pipe()
if os.fork() == 0:
    os.close(read)
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        os._exit(0)  # the orphan: it holds the pipe's write end until it ends
    os._exit(0)
os.close(write)
os.wait()
orphan = b""
while chunk := os.read(read, 16):  # its pid, then end of file: both children are ending
    orphan += chunk
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
# A pipe closes as its holder starts to exit, a moment before the process is a zombie: wait for that.
settle = time.monotonic() + 30
while state(int(orphan)) not in ("Z", "gone") and time.monotonic() < settle:
    time.sleep(0.01)
def zombies():
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                count += stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            pass
    return count
deadline = time.monotonic() + wait
while zombies() and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"zombies: {zombies()}")
"""


def registry_get(address: str, path: str, accept: str = "application/json") -> tuple[dict[str, str], bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://{address}{path}", headers={"Accept": accept})
    with opener.open(request, timeout=5) as response:
        return dict(response.headers), response.read()


def run(store: PodmanStore, reference: str, *command: str, tree: Path | None = None) -> tuple[int, str]:
    volume = ["--volume", f"{tree}:/opt/ml"] if tree else []
    result = podman(store, "run", "--rm", "--network=none", "--pull=never", *volume, reference, *command)
    return result.returncode, result.stdout + result.stderr


def ml_tree(root: Path, program: str, hyperparameters: dict[str, str]) -> Path:
    """/opt/ml as SageMaker lays it out for a job: its hyperparameters (string values) and its code."""
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (root / "code").mkdir()
    (root / "code" / "fit.py").write_text(program)
    return root


def test_image_dev_prints_each_reference_and_digest_it_pushed(built: Built) -> None:
    assert built.python == f"{built.registry}/hyperplan/python:3"
    assert built.sagemaker == f"{built.registry}/hyperplan/sagemaker-python:3"
    _, catalog = registry_get(built.registry, "/v2/_catalog")
    # Both are there (other tests of the session may have pushed images of their own beside them).
    assert {"hyperplan/python", "hyperplan/sagemaker-python"} <= set(json.loads(catalog)["repositories"])
    for name, digest in (("python", built.python_digest), ("sagemaker-python", built.sagemaker_digest)):
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
        headers, _ = registry_get(built.registry, f"/v2/hyperplan/{name}/manifests/3", MANIFEST_TYPES)
        assert headers["Docker-Content-Digest"] == digest


def test_a_clean_store_pulls_the_python_image_by_reference_and_runs_python_in_it(
    built: Built, pulled: PodmanStore
) -> None:
    digest = podman(pulled, "image", "inspect", "--format", "{{.Digest}}", built.python)
    assert digest.stdout.strip() == built.python_digest
    code, said = run(pulled, built.python, "python3", "-c", "import sys; print(sys.version_info[:2])")
    assert (code, said) == (0, "(3, 11)\n")
    code, said = run(pulled, built.python)  # the image's own command: Python, reading an empty stdin
    assert code == 0, said
    imports = f"import {', '.join(STANDARD_LIBRARY)}; print('imported')"
    assert run(pulled, built.python, "python3", "-c", imports) == (0, "imported\n")


def test_the_sagemaker_image_is_the_python_image_and_one_layer_with_train(
    built: Built, pulled: PodmanStore
) -> None:
    def layers(reference: str) -> list[str]:
        found = podman(pulled, "image", "inspect", "--format", "{{json .RootFS.Layers}}", reference)
        return list(json.loads(found.stdout))

    assert layers(built.sagemaker)[:-1] == layers(built.python)
    assert len(layers(built.sagemaker)) == len(layers(built.python)) + 1
    assert run(pulled, built.sagemaker, "test", "-x", "/usr/local/bin/train")[0] == 0
    assert run(pulled, built.python, "test", "-e", "/usr/local/bin/train")[0] == 1


def test_train_runs_the_program_with_its_hyperparameters_and_the_model_appears(
    built: Built, pulled: PodmanStore, tmp_path: Path
) -> None:
    tree = ml_tree(
        tmp_path / "ml",
        FIT,
        {
            "sagemaker_program": '"fit.py"',
            "sagemaker_submit_directory": '"s3://b/code.tar.gz"',
            "epochs": "7",
        },
    )
    code, said = run(pulled, built.sagemaker, "train", tree=tree)
    assert (code, said) == (0, "trained\n")
    assert (tree / "model" / "model.txt").read_text() == "7 epochs; SM_HP_EPOCHS=7\n"
    assert not (tree / "output" / "failure").exists()


def test_a_failing_program_leaves_output_failure_and_a_non_zero_exit(
    built: Built, pulled: PodmanStore, tmp_path: Path
) -> None:
    tree = ml_tree(tmp_path / "ml", FAILING, {"sagemaker_program": '"fit.py"', "epochs": "7"})
    code, said = run(pulled, built.sagemaker, "train", tree=tree)
    assert code == 3
    assert "out of memory at step 12" in said
    failure = (tree / "output" / "failure").read_text()
    assert failure.startswith("ExecuteUserScriptError:\nExitCode 3\n")
    assert 'ErrorMessage "out of memory at step 12"' in failure


def test_train_as_process_1_reaps_the_orphans_the_program_leaves(
    built: Built, pulled: PodmanStore, tmp_path: Path
) -> None:
    tree = ml_tree(tmp_path / "ml", ORPHAN, {"sagemaker_program": '"fit.py"', "wait": "60"})
    assert run(pulled, built.sagemaker, "train", tree=tree) == (0, "zombies: 0\n")
    # The same program as process 1 itself (python3 does not reap): the test can tell.
    control = ("python3", "/opt/ml/code/fit.py", "--wait", "0")
    assert run(pulled, built.python, *control, tree=tree) == (0, "zombies: 1\n")
