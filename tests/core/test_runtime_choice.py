"""Choosing the runtime tenant work runs in, podman or process (issue 45): who asks, the default, the
refusals, and the fleet file's [backend] runtime."""

from __future__ import annotations

import pytest

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.runtime_choice import (
    DEFAULT,
    FLAG,
    FLEET_KEY,
    NOT_ROOT,
    PODMAN,
    PROCESS,
    RUNTIME_ENV,
    Choice,
    Request,
    choose,
    request,
)
from hyperplan.errors import StartRefused, ValidationError

NO_PODMAN = "the podman command (apt-get install podman)"
NO_CATATONIT = "catatonit, Podman's init and pause process (apt-get install catatonit)"
AUTO = Request(None)


# -- who asks ---------------------------------------------------------------------------------------------


def test_the_flag_comes_before_the_fleet_file_which_comes_before_the_variable() -> None:
    assert request("process", "podman", "podman") == Request(PROCESS, FLAG)
    assert request(None, "podman", "process") == Request(PODMAN, FLEET_KEY)
    assert request(None, None, "podman") == Request(PODMAN, RUNTIME_ENV)
    assert request(None, None, None) == Request(None, DEFAULT)


def test_an_empty_variable_is_unset_as_a_shell_means_it() -> None:
    assert request(None, None, "") == AUTO


@pytest.mark.parametrize(
    ("flag", "fleet_file", "variable", "said"),
    [
        ("docker", None, None, "--runtime 'docker': give podman or process"),
        (None, "Podman", None, "[backend] runtime 'Podman': give podman or process"),
        (None, None, "containers", "HYPERPLAN_RUNTIME 'containers': give podman or process"),
    ],
)
def test_an_unknown_runtime_is_refused_naming_who_asked(
    flag: str | None, fleet_file: str | None, variable: str | None, said: str
) -> None:
    with pytest.raises(StartRefused) as refused:
        request(flag, fleet_file, variable)
    assert refused.value.message == said


# -- the default ------------------------------------------------------------------------------------------


def test_by_default_a_root_server_where_podman_is_usable_contains_its_tenants() -> None:
    choice = choose(AUTO, is_root=True, problems=())
    assert choice == Choice(PODMAN, "the default: the server runs as root and Podman is usable")
    assert choice.contained


def test_by_default_a_root_server_without_podman_runs_processes_saying_what_is_missing() -> None:
    choice = choose(AUTO, is_root=True, problems=(NO_PODMAN, NO_CATATONIT))
    assert (choice.runtime, choice.contained) == (PROCESS, False)
    assert choice.why == f"the default: Podman is not usable here, it needs {NO_PODMAN}; {NO_CATATONIT}"


@pytest.mark.parametrize("problems", [(), (NO_PODMAN,)])
def test_by_default_a_server_not_run_as_root_runs_processes(problems: tuple[str, ...]) -> None:
    choice = choose(AUTO, is_root=False, problems=problems)
    assert choice.runtime == PROCESS
    assert "does not run as root" in choice.why


# -- asked for --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("is_root", "problems"), [(True, ()), (True, (NO_PODMAN,)), (False, ())])
def test_process_asked_for_is_process_wherever(is_root: bool, problems: tuple[str, ...]) -> None:
    assert choose(Request(PROCESS, FLAG), is_root=is_root, problems=problems) == Choice(
        PROCESS, "--runtime asks for it"
    )


def test_podman_asked_for_where_it_is_usable_is_podman() -> None:
    assert choose(Request(PODMAN, FLEET_KEY), is_root=True, problems=()) == Choice(
        PODMAN, "[backend] runtime asks for it"
    )


@pytest.mark.parametrize(
    ("is_root", "problems", "missing"),
    [
        (True, (NO_PODMAN, NO_CATATONIT), f"{NO_PODMAN}; {NO_CATATONIT}"),
        (False, (), NOT_ROOT),
        (False, (NO_PODMAN,), f"{NO_PODMAN}; {NOT_ROOT}"),
    ],
)
def test_podman_asked_for_where_it_is_not_usable_refuses_the_start_naming_everything_missing(
    is_root: bool, problems: tuple[str, ...], missing: str
) -> None:
    with pytest.raises(StartRefused) as refused:
        choose(Request(PODMAN, RUNTIME_ENV), is_root=is_root, problems=problems)
    assert refused.value.message == (
        f"HYPERPLAN_RUNTIME podman: Podman is not usable here, it needs {missing}. The server installs "
        "nothing: install them, or give process"
    )


# -- the Slurm back end -----------------------------------------------------------------------------------


def test_the_slurm_back_end_runs_processes_by_default_even_where_podman_is_usable() -> None:
    """Its containers run on the cluster's nodes, which the server cannot inspect: the site opts in."""
    choice = choose(AUTO, is_root=True, problems=(), slurm=True)
    assert choice.runtime == PROCESS
    assert 'the fleet file\'s [backend] runtime = "podman" says they are ready' in choice.why


def test_the_slurm_back_end_runs_containers_when_asked_where_podman_is_usable() -> None:
    assert choose(Request(PODMAN, FLAG), is_root=True, problems=(), slurm=True) == Choice(
        PODMAN, "--runtime asks for it"
    )
    assert choose(Request(PROCESS, FLAG), is_root=True, problems=(), slurm=True).runtime == PROCESS


def test_the_slurm_back_end_refuses_podman_asked_for_where_the_server_cannot_pull_images() -> None:
    """The server pulls and unpacks the images with Podman, as root."""
    with pytest.raises(StartRefused) as refused:
        choose(Request(PODMAN, FLAG), is_root=False, problems=(NO_PODMAN,), slurm=True)
    assert refused.value.message.startswith(
        f"--runtime podman: Podman is not usable here, it needs {NO_PODMAN}"
    )


# -- the fleet file ---------------------------------------------------------------------------------------

ZONES = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
"""
POOL = '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\nprice_per_instance_hour = "9.5"\n'
SLURM = '[backend]\nkind = "slurm"\nslurm_conf = "/etc/slurm/slurm.conf"\n'
LOCAL_POOL = POOL + "count = 4\n"
SLURM_POOL = POOL + 'nodes = "gpu[1-2]"\n'


def _backend(lines: str, pool: str = LOCAL_POOL) -> str:
    return ZONES + lines + pool


@pytest.mark.parametrize("runtime", [PODMAN, PROCESS])
def test_the_fleet_file_names_a_runtime(runtime: str) -> None:
    fleet = parse_fleet(_backend(f'[backend]\nruntime = "{runtime}"\n'))
    assert (fleet.backend.kind, fleet.backend.runtime) == ("local", runtime)


def test_a_fleet_file_without_a_runtime_leaves_it_to_the_start() -> None:
    assert parse_fleet(_backend("")).backend.runtime is None
    assert parse_fleet(_backend(SLURM, SLURM_POOL)).backend.runtime is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('"docker"', "backend.runtime: 'docker' is not one of podman, process"),
        ("true", "backend.runtime"),
    ],
)
def test_an_unknown_runtime_in_the_fleet_file_is_refused_naming_the_key(value: str, said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_fleet(_backend(f"[backend]\nruntime = {value}\n"))
    assert refused.value.message.startswith(said)


@pytest.mark.parametrize("runtime", [PODMAN, PROCESS])
def test_a_slurm_fleet_names_either_runtime_with_a_store_and_a_node_image(runtime: str) -> None:
    extra = 'podman_store = "/srv/podman"\npodman_store_gb = 0\nnode_image = "registry.example/node:1"\n'
    backend = parse_fleet(_backend(SLURM + f'runtime = "{runtime}"\n' + extra, SLURM_POOL)).backend
    assert (backend.kind, backend.runtime) == ("slurm", runtime)
    assert (backend.podman_store, backend.podman_store_gb, backend.node_image) == (
        "/srv/podman",
        0,
        "registry.example/node:1",
    )
