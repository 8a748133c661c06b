"""`make run`'s runtime (issue 45, point 5): what it sets up and serves with, by what is asked, whether it
runs as root and how its setup went; and that it serves what the demo fleet pulls from. No host: the
decision is pure (hyperplan/containers/demo_runtime.py; the setup itself is tests/containers').
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan.app import default_data_dir as servers_default_data_dir
from hyperplan.app import read_fleet_text
from hyperplan.containers.demo_runtime import (
    AUTO,
    DEMO_IMAGES,
    DEMO_PORT,
    PODMAN,
    PROCESS,
    Failure,
    Ready,
    Refusal,
    Serve,
    choose,
    default_data_dir,
    sets_up,
)
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.runtime_choice import Request
from hyperplan.core.runtime_choice import choose as choose_runtime

NO_REGISTRY = Failure("the registry on 127.0.0.1:5000", "port 5000 is taken by another program")


def test_process_sets_up_nothing_and_serves_host_processes_as_root_or_not() -> None:
    for is_root in (True, False):
        assert not sets_up(PROCESS, is_root=is_root)
        assert choose(PROCESS, is_root=is_root) == Serve(("--runtime", PROCESS))


def test_not_root_the_default_serves_host_processes_at_once_saying_why() -> None:
    assert not sets_up(AUTO, is_root=False)
    decision = choose(AUTO, is_root=False)
    assert isinstance(decision, Serve) and decision.arguments == ("--runtime", PROCESS)
    assert decision.say is not None
    assert "NOT contained" in decision.say and "not run as root" in decision.say


def test_not_root_podman_is_refused_without_setting_anything_up() -> None:
    assert not sets_up(PODMAN, is_root=False)
    decision = choose(PODMAN, is_root=False)
    assert isinstance(decision, Refusal)
    assert "needs root" in decision.why and "RUNTIME=process" in decision.why


def test_as_root_the_default_sets_up_then_leaves_the_last_word_to_the_servers_default() -> None:
    assert sets_up(AUTO, is_root=True)
    assert choose(AUTO, is_root=True) == Serve(())
    # ... which, as root with nothing missing on the host, is podman (core/runtime_choice.py).
    assert choose_runtime(Request(None), is_root=True, problems=()).runtime == PODMAN


def test_as_root_the_default_falls_back_to_host_processes_naming_the_failed_step() -> None:
    decision = choose(AUTO, is_root=True, failure=NO_REGISTRY)
    assert isinstance(decision, Serve) and decision.arguments == ("--runtime", PROCESS)
    assert decision.say == (
        "setting up containers failed at the registry on 127.0.0.1:5000: port 5000 is taken by another "
        "program; tenant work runs as host processes, NOT contained"
    )


def test_what_a_tool_said_comes_below_the_line_that_says_it_all() -> None:
    apt = Failure("installing the host's packages", "could not install podman with apt-get:\nE: no space")
    decision = choose(AUTO, is_root=True, failure=apt)
    assert isinstance(decision, Serve) and decision.say is not None
    line, said = decision.say.split("\n")
    assert line.endswith(
        "could not install podman with apt-get; tenant work runs as host processes, NOT contained"
    )
    assert said == "E: no space"


def test_podman_sets_up_and_serves_podman_or_refuses_without_falling_back() -> None:
    assert sets_up(PODMAN, is_root=True)
    assert choose(PODMAN, is_root=True) == Serve(("--runtime", PODMAN))
    refused = choose(PODMAN, is_root=True, failure=NO_REGISTRY)
    assert isinstance(refused, Refusal)
    assert refused.why.startswith("RUNTIME=podman: setting up containers failed at the registry on")


def test_an_unknown_runtime_is_refused_naming_the_ones_there_are() -> None:
    assert not sets_up("docker", is_root=True)
    decision = choose("docker", is_root=True)
    assert isinstance(decision, Refusal)
    assert decision.why.startswith("RUNTIME=docker: give auto, podman, process")


def test_what_is_said_of_the_registry_first_then_on_the_next_start() -> None:
    directory = Path("/data/registry")
    first = Ready("127.0.0.1:5000", directory, True, ("127.0.0.1:5000/hyperplan/python:3",), 41.0)
    assert first.describe()[0] == (
        "containers set up in 41.0 s: the registry 127.0.0.1:5000 started (/data/registry), the demo's "
        "images built into it"
    )
    assert first.describe()[1].endswith("`scripts/registry-dev down /data/registry` stops it")
    again = Ready("127.0.0.1:5000", directory, False, (), 0.25)
    assert "already up (/data/registry), the demo's images already in it" in again.describe()[0]
    theirs = Ready("127.0.0.1:5000", None, False, (), 0.1)
    assert len(theirs.describe()) == 1 and "(not started here)" in theirs.describe()[0]


@pytest.mark.parametrize("configured", [None, "~/elsewhere"])
def test_the_registry_is_kept_in_the_data_directory_the_server_uses(
    configured: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if configured is None:
        monkeypatch.delenv("HYPERPLAN_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("HYPERPLAN_DATA_DIR", configured)
    assert default_data_dir() == servers_default_data_dir()


def test_the_demo_fleet_pulls_every_image_from_the_registry_the_setup_fills() -> None:
    fleet = parse_fleet(read_fleet_text(None))
    registry = f"127.0.0.1:{DEMO_PORT}"
    served = {f"{registry}/{name}" for name, _ in DEMO_IMAGES}
    image_map = fleet.image_sources.image_map
    targets = {*image_map.exact.values(), *(target for _, target in image_map.prefixes)}
    assert targets == served
    assert fleet.backend.node_image in served
    assert fleet.image_sources.insecure(registry)  # plain HTTP, as registry-dev serves it
