"""`hyperplan clusters exec` returns at most the server's limit of each stream, says when it cut, and the
server never holds more than that, however much a command writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import Server, wait_until

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
MIB = 1 << 20


def _write(stdout_bytes: int, stderr_bytes: int = 0) -> list[str]:
    """A command that writes that many bytes to each stream, in 1 MiB pieces."""
    program = (
        "import sys\n"
        f"left = {stdout_bytes}\n"
        "while left:\n"
        f"    piece = min(left, {MIB}); sys.stdout.write('o' * piece); left -= piece\n"
        f"sys.stderr.write('e' * {stderr_bytes})\n"
    )
    return ["python3", "-c", program]


def _running_node(server: Server) -> str:
    client = server.sagemaker()
    client.create_cluster(
        ClusterName="chatty",
        InstanceGroups=[
            {
                "InstanceGroupName": "controller",
                "InstanceType": "ml.m5.12xlarge",
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
            }
        ],
    )

    def running() -> list[str]:
        nodes = client.list_cluster_nodes(ClusterName="chatty")["ClusterNodeSummaries"]
        return [n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"]

    found = wait_until(running)
    assert found, client.list_cluster_nodes(ClusterName="chatty")
    return str(found[0])


def _start(server_factory: type[Server], tmp_path: Path) -> Server:
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\ntrue\n")
    return server.start()


def _exec(server: Server, node: str, command: list[str]) -> dict[str, Any]:
    route = f"/api/v1/clusters/chatty/nodes/{node}/exec"
    return dict(server.native().post(route, {"Command": command, "TimeoutSeconds": 120}))


def _peak_resident_bytes(server: Server) -> int:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_exec_output_is_cut_at_one_mib_per_stream_and_memory_stays_bounded(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = _start(server_factory, tmp_path)
    node = _running_node(server)
    small = _exec(server, node, _write(10, 5))
    assert (small["Stdout"], small["StdoutTruncated"], small["Stderr"], small["StderrTruncated"]) == (
        "o" * 10,
        False,
        "e" * 5,
        False,
    )

    before = _peak_resident_bytes(server)
    answer = _exec(server, node, _write(50 * MIB, 3 * MIB // 2))
    grew = _peak_resident_bytes(server) - before
    assert answer["ExitCode"] == 0
    assert (answer["Stdout"], answer["StdoutTruncated"]) == ("o" * MIB, True)
    assert (answer["Stderr"], answer["StderrTruncated"]) == ("e" * MIB, True)
    # Two 1 MiB streams, as bytes, text and JSON: some MiB, never the 50 the command wrote.
    assert grew < 40 * MIB, f"the server's peak memory grew by {grew / MIB:.0f} MiB"

    cli = server.cli("clusters", "exec", "chatty", node, "--", *_write(2 * MIB))
    assert len(cli.stdout) == MIB and "stdout cut short at the server's exec output limit" in cli.stderr


def test_the_limit_is_a_setting(
    server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPERPLAN_EXEC_OUTPUT_LIMIT", "1000")
    server = _start(server_factory, tmp_path)
    node = _running_node(server)
    answer = _exec(server, node, _write(1001, 1000))
    assert (len(answer["Stdout"]), answer["StdoutTruncated"]) == (1000, True)
    assert (len(answer["Stderr"]), answer["StderrTruncated"]) == (1000, False)
