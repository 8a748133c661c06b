"""The OCI runtime configuration of a Slurm task's container, as users and operators would check it: whose
ids it maps, which namespaces it makes, what it mounts and how, and which specs it refuses."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.base import Mount
from hyperplan.backends.oci_bundle import (
    DEFAULT_PATH,
    ENV_DIR_INSIDE,
    INIT_INSIDE,
    TEMPLATE,
    OciSpec,
    runtime_config,
    write_template,
)

ROOTFS = Path("/work/images/0123/rootfs")


def spec(**changes: Any) -> OciSpec:
    values: dict[str, Any] = {
        "rootfs": ROOTFS,
        "uid": 1234,
        "gid": 2345,
        "argv": ("python3", "train.py", "--epochs", "3"),
        "env": {"SM_MODEL_DIR": "/opt/ml/model"},
        "cwd": "/opt/ml/code",
        "hostname": "algo-2",
        "mounts": (
            Mount(Path("/work/jobs/j1/ml"), "/opt/ml"),
            Mount(Path("/work/nodes/n1/env"), ENV_DIR_INSIDE, read_only=True),
        ),
    }
    values.update(changes)
    return OciSpec(**values)


def mount_at(config: dict[str, Any], destination: str) -> dict[str, Any]:
    [found] = [m for m in config["mounts"] if m["destination"] == destination]
    return found


def namespaces(config: dict[str, Any]) -> set[str]:
    return {namespace["type"] for namespace in config["linux"]["namespaces"]}


def test_root_inside_is_the_account_user_and_nobody_else() -> None:
    linux = runtime_config(spec())["linux"]
    assert linux["uidMappings"] == [{"containerID": 0, "hostID": 1234, "size": 1}]
    assert linux["gidMappings"] == [{"containerID": 0, "hostID": 2345, "size": 1}]
    assert runtime_config(spec())["process"]["user"] == {"uid": 0, "gid": 0}


def test_namespaces_of_its_own_and_the_nodes_network_unless_asked() -> None:
    own = {"pid", "ipc", "uts", "mount", "user"}
    assert namespaces(runtime_config(spec())) == own
    assert namespaces(runtime_config(spec(own_network=True))) == {*own, "network"}


def test_it_stays_in_the_callers_cgroup() -> None:
    """No cgroup namespace, path or resources: rootless runc leaves the container in the Slurm step's
    cgroup, whose limits and end then hold it."""
    config = runtime_config(spec())
    assert "cgroup" not in namespaces(config)
    assert "cgroupsPath" not in config["linux"]
    assert "resources" not in config["linux"]
    assert not [m for m in config["mounts"] if m["type"] == "cgroup"]


def test_the_image_is_the_root_read_only_and_the_hostname_is_set() -> None:
    config = runtime_config(spec())
    assert config["root"] == {"path": str(ROOTFS), "readonly": True}
    assert config["hostname"] == "algo-2"
    assert config["ociVersion"] == "1.0.2"


def test_catatonit_is_process_one_and_runs_the_program_in_its_group() -> None:
    config = runtime_config(spec(init=Path("/opt/bin/catatonit")))
    process = config["process"]
    assert process["args"] == [INIT_INSIDE, "-g", "--", "python3", "train.py", "--epochs", "3"]
    assert process["cwd"] == "/opt/ml/code"
    assert process["terminal"] is False
    assert process["noNewPrivileges"] is True
    init = mount_at(config, INIT_INSIDE)
    assert init["source"] == "/opt/bin/catatonit"
    assert "ro" in init["options"] and "noexec" not in init["options"]


def test_the_environment_gets_a_path_unless_it_has_one() -> None:
    assert runtime_config(spec())["process"]["env"] == ["SM_MODEL_DIR=/opt/ml/model", f"PATH={DEFAULT_PATH}"]
    own = runtime_config(spec(env={"PATH": "/opt/conda/bin:/usr/bin"}))["process"]["env"]
    assert own == ["PATH=/opt/conda/bin:/usr/bin"]


def test_binds_are_read_only_or_writable_as_the_spec_says_never_suid_or_devices() -> None:
    config = runtime_config(spec())
    writable, published = mount_at(config, "/opt/ml"), mount_at(config, ENV_DIR_INSIDE)
    assert writable["source"] == "/work/jobs/j1/ml" and writable["type"] == "bind"
    assert "rw" in writable["options"] and "ro" not in writable["options"]
    assert published["source"] == "/work/nodes/n1/env"
    assert "ro" in published["options"] and "rw" not in published["options"]
    for bind in (writable, published):
        assert {"rbind", "nosuid", "nodev"} <= set(bind["options"])


def test_the_kernels_file_systems_as_rootless_runc_can_mount_them() -> None:
    config = runtime_config(spec())
    assert [m["destination"] for m in config["mounts"]][:6] == [
        "/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys",
    ]  # fmt: skip
    assert mount_at(config, "/proc")["type"] == "proc"
    assert "gid=5" not in mount_at(config, "/dev/pts")["options"]  # the tty group is not mapped
    sys = mount_at(config, "/sys")
    assert sys["type"] == "bind" and sys["source"] == "/sys"  # a sysfs mount is refused rootless
    assert {"rbind", "ro", "nosuid", "noexec", "nodev"} <= set(sys["options"])
    assert "/proc/kcore" in config["linux"]["maskedPaths"]
    assert "/proc/sys" in config["linux"]["readonlyPaths"]


def test_capabilities_are_podmans_default_set_and_only_that() -> None:
    capabilities = runtime_config(spec())["process"]["capabilities"]
    assert set(capabilities) == {"bounding", "effective", "permitted"}  # none inheritable or ambient
    assert "CAP_SYS_ADMIN" not in capabilities["bounding"]
    assert "CAP_CHOWN" in capabilities["bounding"] and "CAP_SETUID" in capabilities["bounding"]
    assert capabilities["bounding"] == capabilities["effective"] == capabilities["permitted"]


def test_no_rlimits_the_step_keeps_its_own() -> None:
    assert "rlimits" not in runtime_config(spec())["process"]


@pytest.mark.parametrize(
    "target", ["opt/ml", "/opt/../etc", "/proc", "/dev", "/sys", "/", INIT_INSIDE, "/dev/shm"]
)
def test_a_bad_mount_target_is_refused_naming_it(target: str) -> None:
    bad = Mount.__new__(Mount)  # (Mount itself refuses some; the spec checks again, whatever made it)
    object.__setattr__(bad, "source", Path("/work/x"))
    object.__setattr__(bad, "target", target)
    object.__setattr__(bad, "read_only", False)
    with pytest.raises(ValueError, match=re.escape(repr(target))):
        spec(mounts=(bad,))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"uid": 0}, "not root"),
        ({"gid": 0}, "not root"),
        ({"argv": ()}, "argv is empty"),
        ({"cwd": "code"}, "working directory 'code'"),
        ({"env": {"A=B": "c"}}, "'A=B'"),
    ],
)
def test_other_bad_specs_are_refused_saying_why(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        spec(**changes)


def test_the_template_is_written_whole_for_the_accounts_group_alone(tmp_path: Path) -> None:
    """Its variables are the program's: readable by the writer and the account's group, nobody else."""
    group = os.getgid() or spec().gid  # (only root may give a file to a group it is not in)
    path = write_template(tmp_path, spec(gid=group))
    assert path == tmp_path / TEMPLATE
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_gid == group
    assert json.loads(path.read_text()) == runtime_config(spec(gid=group))
    assert [p.name for p in tmp_path.iterdir()] == [TEMPLATE]  # no temporary file left
