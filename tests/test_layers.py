"""The import rules between layers (docs/ARCHITECTURE.md, "Layers"), checked over the package's source.

Every module of `hyperplan` is parsed with `ast`; every import counts, at the top of a module, inside a
function or under `if TYPE_CHECKING:`, since a function-level import that dodges a cycle is still one.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import hyperplan

PACKAGE = Path(hyperplan.__file__).parent

# Each layer, by module prefix; the longest prefix wins.
LAYERS = {
    "hyperplan": "root",
    "hyperplan.errors": "errors",
    "hyperplan.waits": "errors",  # the guard of answers on the event loop: a leaf, checked from any layer
    "hyperplan.host_packages": "host-packages",  # apt-get for the dev tools: a leaf, never the server's
    "hyperplan.worker": "worker",
    "hyperplan.metrics": "worker",  # Prometheus instruments: nothing of hyperplan, counted from any layer
    "hyperplan.core": "core",
    "hyperplan.clock": "clock",
    "hyperplan.fleet": "fleet-data",
    "hyperplan.store": "store",
    "hyperplan.objects": "objects",
    "hyperplan.backends": "backends",
    "hyperplan.slurm": "slurm",
    "hyperplan.containers": "containers",  # dev registry and images built offline: scripts, not the server
    "hyperplan.training": "training",
    "hyperplan.events": "events",
    "hyperplan.services": "services",
    "hyperplan.notify": "services",  # the webhook dispatcher: a worker of the services' layer
    "hyperplan.wire": "wire",
    "hyperplan.server": "server",
    "hyperplan.console": "console",  # the web console, an edge beside the server that mounts it
    "hyperplan.signing": "signing",
    "hyperplan.app": "app",
    "hyperplan.cli": "cli",
    "hyperplan.__main__": "cli",
}

_BELOW_SERVICES = {
    *("core", "store", "objects", "backends", "slurm", "training", "clock", "events", "worker", "errors")
}

# What each layer may import besides itself.
ALLOWED: dict[str, set[str]] = {
    "root": set(),
    "errors": set(),
    "worker": set(),  # threads and wakes only: every layer may build workers
    "fleet-data": set(),
    "host-packages": set(),
    "core": {"errors"},
    "clock": {"errors"},
    "store": {"core", "errors", "host-packages"},  # host-packages: postgres_dev.py installs PostgreSQL
    "objects": {"core", "errors"},
    # Slurm's command-line tools and pure parsers of their output; devcluster.py installs Slurm.
    "slurm": {"core", "errors", "host-packages"},
    # Its train program runs in an image where hyperplan is not; the host side installs its tools.
    "containers": {"host-packages"},
    # The package's own location, for the node agent it starts; Slurm's adapter, for the Slurm back end;
    # the container tools (Podman's store and runtime), for containers.
    "backends": {"root", "slurm", "containers", "errors"},
    "training": {"objects", "core", "errors"},
    "events": {"store", "clock", "worker", "core", "errors"},
    "services": _BELOW_SERVICES,
    # The edges translate: services own the transactions and hand them views, so no store (see below).
    "wire": {"services"} | _BELOW_SERVICES - {"store"},
    "server": {"console", "wire", "services"} | _BELOW_SERVICES - {"store"},
    "console": {"wire", "services"} | _BELOW_SERVICES - {"store"},
    "signing": {"wire", "errors"},  # the SigV4 canonical forms, shared with the server's verification
    "app": {"server", "wire", "services", "fleet-data"} | _BELOW_SERVICES,
    "cli": {"signing", "app", "server", "wire", "services", "root"} | _BELOW_SERVICES,
}


def layer_of(module: str) -> str:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    # Alembic's migrations are scripts it loads by path, not modules of the package.
    paths = [path for path in sorted(PACKAGE.rglob("*.py")) if "migrations" not in path.parts]
    return {module_name(path): path for path in paths}


@functools.cache  # several tests read the same modules' imports: each parsed once a run
def import_statements(module: str, path: Path) -> tuple[tuple[str, str | None, int], ...]:
    """(module, name imported from it or None, line) for every import anywhere in the module, relative
    ones made absolute."""
    return tuple(_import_statements(module, path))


def _import_statements(module: str, path: Path) -> Iterator[tuple[str, str | None, int]]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name, node.lineno


def imports_of(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module of the package, line) for every import anywhere in the module."""
    for base, name, line in import_statements(module, path):
        if base.split(".")[0] != "hyperplan":
            continue
        child = f"{base}.{name}" if name else base
        yield (child if child in known else base), line


def import_graph() -> dict[str, dict[str, int]]:
    found = modules()
    known = set(found)
    return {
        module: {target: line for target, line in imports_of(module, path, known) if target != module}
        for module, path in found.items()
    }


def test_every_import_follows_the_layer_rules() -> None:
    wrong = [
        f"{module}:{line} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in import_graph().items()
        for target, line in targets.items()
        if layer_of(target) != layer_of(module) and layer_of(target) not in ALLOWED[layer_of(module)]
    ]
    assert not wrong, "imports across the layer rules:\n" + "\n".join(sorted(wrong))


# The services' packages (docs/ARCHITECTURE.md, "Services by entity"), bottom up, and which other ones each
# may import; within a package anything goes. No module sits in hyperplan/services itself.
SERVICES = "hyperplan.services"
SERVICES_PACKAGES: dict[str, set[str]] = {
    "accounts": set(),  # who calls: accounts, users, keys, OS identities, the audit trail, sealed secrets
    "runtime": {"accounts"},  # the context and what it holds, status moves, the drain flag, the fleet
    "storage": {"runtime", "accounts"},  # buckets and their rights
    "webhooks": {"runtime", "accounts"},  # queued in a plan's transaction by plans/lifecycle.py
    "plans": {"webhooks", "runtime", "accounts"},
    "clusters": {"plans", "storage", "runtime", "accounts"},
    "jobs": {"clusters", "plans", "storage", "runtime", "accounts"},
    "slurm": {"jobs", "clusters", "plans", "runtime", "accounts"},  # the Slurm reconcilers
    # What spans the entities: adoption, drain, retention, account deletion, the console's and admin views.
    "orchestration": {"jobs", "clusters", "plans", "storage", "runtime", "accounts"},
}


def services_package(module: str) -> str | None:
    """The services package a module of hyperplan.services belongs to ("" for a module directly in
    hyperplan/services), None for a module outside the services."""
    if not module.startswith(SERVICES + "."):
        return None
    rest = module[len(SERVICES) + 1 :]
    return rest.split(".")[0] if "." in rest or rest in SERVICES_PACKAGES else ""


def services_package_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        source = services_package(module)
        if not source:
            continue
        for target, line in targets.items():
            dest = services_package(target)
            if dest is None or dest == source:
                continue
            if dest not in SERVICES_PACKAGES.get(source, set()):
                wrong.append(f"{module}:{line} (services/{source}) imports {target} (services/{dest})")
    return sorted(wrong)


def test_every_import_between_services_packages_follows_their_table() -> None:
    wrong = services_package_violations(import_graph())
    assert not wrong, "imports across the services packages' rules:\n" + "\n".join(wrong)


def test_the_services_package_rule_fails_on_a_new_forbidden_edge() -> None:
    graph = {
        "hyperplan.services.accounts.accounts": {"hyperplan.services.jobs.jobs": 7},  # up: forbidden
        "hyperplan.services.jobs.jobs": {"hyperplan.services.plans": 3, "hyperplan.services.jobs.x": 4},
        "hyperplan.services.plans.plans": {"hyperplan.services.slurm.slurm_reservations": 9},
    }
    assert services_package_violations(graph) == [
        "hyperplan.services.accounts.accounts:7 (services/accounts) imports hyperplan.services.jobs.jobs"
        " (services/jobs)",
        "hyperplan.services.plans.plans:9 (services/plans) imports"
        " hyperplan.services.slurm.slurm_reservations (services/slurm)",
    ]


def test_the_services_packages_form_a_dag() -> None:
    assert set().union(*SERVICES_PACKAGES.values()) <= set(SERVICES_PACKAGES)
    table = {name: dict.fromkeys(allowed, 0) for name, allowed in SERVICES_PACKAGES.items()}
    assert not _cycles(table)


def test_every_services_module_sits_in_a_listed_package() -> None:
    """No module directly in hyperplan/services (but its empty __init__), no package the table omits, and
    each package's __init__ a docstring at most: re-exports there would make cycles at import time."""
    found = modules()
    wrong = [
        module
        for module in found
        if services_package(module) is not None and services_package(module) not in SERVICES_PACKAGES
    ]
    assert not wrong, "services modules outside the listed packages: " + ", ".join(sorted(wrong))
    for module in [SERVICES, *(f"{SERVICES}.{name}" for name in SERVICES_PACKAGES)]:
        body = ast.parse(found[module].read_text()).body
        docstring_only = all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)
        assert docstring_only, module


# Each package's public surface: the modules that code outside the package may import. The rest are its
# own. The edges (wire, server, console, cli) get the smaller one: entry points and views. The packages
# above, and the composition root (hyperplan/app.py, which builds the workers), get what they list too.
EDGE_SURFACE: dict[str, set[str]] = {
    "accounts": {"accounts", "audit", "os_users", "registry_credentials", "sealed_secrets"},
    "runtime": {"context", "drain_state", "fleet"},
    "storage": {"bucket_rights"},
    "webhooks": {"webhooks", "webhook_admin"},
    "plans": {
        "plans",
        "plan_views",
        "extensions",
        "extension_policy",
        "lending",
        "payments",
        "quotas",
        "reclaim_warnings",
        "returns",
        "tags",
        "usage",
    },
    "clusters": {"clusters", "cluster_views", "cluster_request", "cluster_exec", "group_plans"},
    "jobs": {"jobs", "job_views", "job_request", "job_records", "job_logs", "log_streams"},
    "slurm": set(),
    "orchestration": {"account_views", "user_views", "audit_views", "console_views", "clock", "drain"},
}
SERVICES_SURFACE: dict[str, set[str]] = {
    "accounts": EDGE_SURFACE["accounts"] | {"acting", "key_cache", "os_ids", "users", "work_root"},
    "runtime": EDGE_SURFACE["runtime"]
    | {"status", "tenancy", "live_calendar", "job_work", "console_sessions", "rate_limiter", "leadership"}
    | {"shared_state", "slurm_placement", "slurm_state", "containment"},
    "storage": EDGE_SURFACE["storage"],
    "webhooks": EDGE_SURFACE["webhooks"],
    "plans": EDGE_SURFACE["plans"] | {"lifecycle", "capacity_claims", "on_demand", "loans", "resale"},
    "clusters": EDGE_SURFACE["clusters"]
    | {"cluster_groups", "cluster_nodes", "cluster_reconcile", "cluster_records", "metering", "node_watcher"}
    | {"group_capacity"},
    "jobs": EDGE_SURFACE["jobs"]
    | {"job_queue", "job_status", "job_watch", "job_deadlines", "job_runner", "spot"},
    "slurm": {"slurm_reservations"},
    "orchestration": EDGE_SURFACE["orchestration"] | {"adoption", "demo_load", "fleet_metrics", "retention"},
}
EDGES = ("wire", "server", "console", "cli")


def surface_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        source = services_package(module)
        for target, line in targets.items():
            dest = services_package(target)
            if not dest or dest == source or target == f"{SERVICES}.{dest}":
                continue
            name = target.split(".")[3]
            surface = EDGE_SURFACE if layer_of(module) in EDGES else SERVICES_SURFACE
            if name not in surface[dest]:
                wrong.append(f"{module}:{line} imports {target}, not on services/{dest}'s surface")
    return sorted(wrong)


def test_code_outside_a_services_package_imports_only_its_surface() -> None:
    wrong = surface_violations(import_graph())
    assert not wrong, "imports past a services package's surface:\n" + "\n".join(wrong)


def test_the_surface_rule_fails_on_an_import_of_a_package_s_own_module() -> None:
    graph = {
        "hyperplan.server.native": {
            "hyperplan.services.jobs.job_launch": 5,
            "hyperplan.services.jobs.jobs": 6,
        },
        "hyperplan.wire.ops.plans": {"hyperplan.services.plans.lifecycle": 8},  # others may, the edges not
        "hyperplan.services.orchestration.drain": {"hyperplan.services.plans.lifecycle": 9},
        "hyperplan.services.jobs.job_queue": {"hyperplan.services.jobs.job_launch": 3},  # within: anything
    }
    assert surface_violations(graph) == [
        "hyperplan.server.native:5 imports hyperplan.services.jobs.job_launch,"
        " not on services/jobs's surface",
        "hyperplan.wire.ops.plans:8 imports hyperplan.services.plans.lifecycle,"
        " not on services/plans's surface",
    ]


def test_every_surface_module_exists_and_the_edges_surface_is_within_the_whole() -> None:
    found = modules()
    for package, surface in SERVICES_SURFACE.items():
        assert EDGE_SURFACE[package] <= surface, package
        missing = [name for name in surface if f"{SERVICES}.{package}.{name}" not in found]
        assert not missing, f"services/{package}: {missing}"


# Modules the edges (the SageMaker protocol and the HTTP server) must not import: ORM code belongs to the
# services, which own their transactions and return views.
EDGE_LAYERS = ("wire", "server", "console")
ORM_MODULES = ("sqlalchemy", "hyperplan.store.schema")


def test_the_edges_hold_no_orm_code() -> None:
    wrong = [
        f"{module}:{line} imports {target}"
        for module, path in modules().items()
        if layer_of(module) in EDGE_LAYERS
        for target, line in absolute_imports(module, path)
        if any(target == name or target.startswith(name + ".") for name in ORM_MODULES)
    ]
    assert not wrong, "ORM imports at the edges:\n" + "\n".join(sorted(wrong))


def absolute_imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(module, line) for every import anywhere in the module, third-party ones included."""
    for base, name, line in import_statements(module, path):
        yield (f"{base}.{name}" if name else base), line


def test_the_orm_rule_sees_every_form_of_import(tmp_path: Path) -> None:
    path = tmp_path / "example.py"
    path.write_text(
        "import sqlalchemy.orm\nfrom sqlalchemy import select\n"
        "def f():\n    from ..store import schema\n    from hyperplan.store.schema import Cluster\n"
    )
    found = dict(absolute_imports("hyperplan.wire.example", path))
    assert found == {
        "sqlalchemy.orm": 1,
        "sqlalchemy.select": 2,
        "hyperplan.store.schema": 4,
        "hyperplan.store.schema.Cluster": 5,
    }


def test_there_is_no_import_cycle() -> None:
    graph = import_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """The rules would be empty words if imports inside functions or under TYPE_CHECKING escaped them."""
    path = tmp_path / "example.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from hyperplan.app import Application\n"
        "def f():\n    from hyperplan.services import jobs\n    from . import calendar\n"
    )
    known = {"hyperplan.services.jobs", "hyperplan.core.calendar"}
    found = dict(imports_of("hyperplan.core.example", path, known))
    assert found == {"hyperplan.app": 3, "hyperplan.services.jobs": 5, "hyperplan.core.calendar": 6}
    assert {layer_of(target) for target in found} - ALLOWED["core"] - {"core"} == {"app", "services"}
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
