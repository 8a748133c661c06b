"""What a host lacks for Podman containers (issue 45), found on PATH and in /proc as the server finds it:
here on a PATH of the test's own, with programs that are files of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan.backends.runtime_choice import PODMAN_HELPER_DIRS, podman_problems

NO_PODMAN = "the podman command (apt-get install podman)"
NO_RUNTIME = "an OCI runtime, runc (apt-get install runc)"
NO_CATATONIT = "catatonit, Podman's init and pause process (apt-get install catatonit)"


def _programs(directory: Path, *names: str) -> Path:
    directory.mkdir()
    for name in names:
        program = directory / name
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
    return directory


def _namespaces(tmp_path: Path, allowed: str) -> Path:
    setting = tmp_path / "max_user_namespaces"
    setting.write_text(f"{allowed}\n")
    return setting


def test_a_host_with_podman_a_runtime_catatonit_and_user_namespaces_lacks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_programs(tmp_path / "bin", "podman", "runc", "catatonit")))
    assert podman_problems(_namespaces(tmp_path, "15000")) == ()


def test_a_path_without_podman_or_a_runtime_names_both_and_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_programs(tmp_path / "bin", "catatonit")))
    assert podman_problems(_namespaces(tmp_path, "15000")) == (NO_PODMAN, NO_RUNTIME)


def test_catatonit_is_looked_for_in_podmans_helper_directories_then_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_programs(tmp_path / "bin", "podman", "runc")))
    problems = podman_problems(_namespaces(tmp_path, "15000"))
    in_helpers = any((directory / "catatonit").is_file() for directory in PODMAN_HELPER_DIRS)
    assert problems == (() if in_helpers else (NO_CATATONIT,))  # Debian: /usr/libexec/podman/catatonit


@pytest.mark.parametrize("allowed", ["0", "-1"])
def test_a_kernel_with_user_namespaces_off_is_named_with_the_setting_that_turns_them_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed: str
) -> None:
    monkeypatch.setenv("PATH", str(_programs(tmp_path / "bin", "podman", "runc", "catatonit")))
    setting = _namespaces(tmp_path, allowed)
    assert podman_problems(setting) == (
        f"user namespaces ({setting} is {allowed}: sysctl -w user.max_user_namespaces=15000)",
    )


def test_a_kernel_without_user_namespaces_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(_programs(tmp_path / "bin", "podman", "runc", "catatonit")))
    missing = tmp_path / "no-such-setting"
    assert podman_problems(missing) == (f"user namespaces (this kernel has none: {missing} cannot be read)",)
