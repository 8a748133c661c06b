"""The dev cluster for the Slurm tests: brought up once per test session (per worker), torn down at its
end even when a test fails (tests/slurm/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hyperplan.slurm.client import SlurmClient

SCRIPT = Path(__file__).parents[2] / "scripts" / "slurm-dev-cluster"


def dev_cluster(command: str, directory: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), command, str(directory), *more],
        capture_output=True,
        text=True,
        timeout=900,  # a first `up` on a fresh machine installs Slurm
    )


def reachable_directory(prefix: str = "hp-slurm-") -> Path:
    """A directory under /tmp every user may pass through (pytest's own are 0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o711)
    return root


@dataclass(frozen=True)
class Cluster:
    directory: Path
    client: SlurmClient

    @property
    def fleet(self) -> Path:
        return self.directory / "fleet.toml"

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"


def running_cluster() -> Iterator[Cluster]:
    root = reachable_directory()
    directory = root / "cluster"
    try:
        result = dev_cluster("up", directory)
        assert result.returncode == 0, f"slurm-dev-cluster up failed:\n{result.stderr}"
        yield Cluster(directory, SlurmClient(directory / "slurm.conf"))
    finally:
        dev_cluster("down", directory)
        shutil.rmtree(root, ignore_errors=True)
