"""The runtime an application starts with (issue 45): who asks wins in order (the flag, the fleet file's
[backend] runtime, HYPERPLAN_RUNTIME), and what cannot be served refuses the start before the store opens.
Podman is made unusable by a PATH of the test's own, where no podman is found."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan.app import AppConfig, Application
from hyperplan.errors import StartRefused
from tests.harness import SERVER_START, unisolated

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
NO_PODMAN = "the podman command (apt-get install podman)"


def _config(data_dir: Path, fleet: Path = SMALL_FLEET, runtime: str | None = None) -> AppConfig:
    return AppConfig(
        data_dir=data_dir,
        fleet_path=fleet,
        clock="manual",
        clock_start=SERVER_START,
        runtime=runtime,
        **unisolated(data_dir),
    )


def _small_fleet_with(tmp_path: Path, backend: str) -> Path:
    """The small fleet with `backend` as its [backend] table."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f"{SMALL_FLEET.read_text()}\n{backend}\n")
    return fleet


@pytest.fixture
def no_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _refusal(config: AppConfig) -> str:
    with pytest.raises(StartRefused) as refused:
        Application(config).open()
    assert not (config.data_dir / "hyperplan.db").exists()  # refused before the store opens
    return refused.value.message


@pytest.mark.usefixtures("no_podman")
def test_the_fleet_files_podman_comes_before_the_variable_and_is_refused_where_podman_is_missing(
    tmp_path: Path,
) -> None:
    fleet = _small_fleet_with(tmp_path, '[backend]\nruntime = "podman"')  # the session says process
    message = _refusal(_config(tmp_path / "data", fleet))
    assert message.startswith(f"[backend] runtime podman: Podman is not usable here, it needs {NO_PODMAN}")
    assert message.endswith("The server installs nothing: install them, or give process")


@pytest.mark.usefixtures("no_podman")
def test_the_variable_asks_when_nothing_else_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERPLAN_RUNTIME", "podman")
    assert _refusal(_config(tmp_path / "data")).startswith(
        f"HYPERPLAN_RUNTIME podman: Podman is not usable here, it needs {NO_PODMAN}"
    )


def test_the_flag_comes_before_the_fleet_file(tmp_path: Path) -> None:
    fleet = _small_fleet_with(tmp_path, '[backend]\nruntime = "podman"')
    application = Application(_config(tmp_path / "data", fleet, runtime="process"))
    try:
        settings = application.open().settings
        assert (settings.runtime, settings.contained) == ("process", False)
    finally:
        application.stop()
