"""The runtime as a server shows it (issue 45): /healthz and the start's warning with runtime process (what
the test session pins), `serve --runtime` refused when it asks for what cannot be served, and, as root
where Podman is usable, a server on runtime podman saying its tenants are contained."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from pathlib import Path

from tests.harness import BIN, Server, free_port

NOT_CONTAINED = "tenant work is NOT contained: nodes and job instances run as host processes"


def _healthz(server: Server) -> dict[str, object]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        return dict(json.loads(connection.getresponse().read()))
    finally:
        connection.close()


def _serve(data_dir: Path, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hyperplan serve` on PATH `path` and no HYPERPLAN_ setting of the caller's (the session's runtime
    among them); expected to refuse, so it never runs long."""
    return subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--port", str(free_port()), "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "400", "PATH": str(path)}
        | {name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
    )


def test_a_server_pinned_to_process_says_its_tenants_are_not_contained(fast_server: Server) -> None:
    health = _healthz(fast_server)
    assert (health["runtime"], health["contained"]) == ("process", False)
    assert NOT_CONTAINED in fast_server.log()
    assert "(HYPERPLAN_RUNTIME asks for it)" in fast_server.log()  # tests/conftest.py pins it


def test_serve_runtime_podman_where_podman_is_missing_refuses_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    refused = _serve(tmp_path / "data", empty, "--isolation", "none", "--runtime", "podman")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert (
        "StartRefused: --runtime podman: Podman is not usable here, it needs the podman command (apt-get "
        "install podman); an OCI runtime, runc (apt-get install runc)"
    ) in said
    assert "The server installs nothing: install them, or give process" in said
    assert not (tmp_path / "data" / "hyperplan.db").exists()


def test_serve_runtime_with_an_unknown_runtime_refuses_before_anything_is_made(tmp_path: Path) -> None:
    refused = _serve(tmp_path / "data", Path("/usr/bin"), "--runtime", "docker")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "StartRefused: --runtime 'docker': give podman or process" in " ".join(refused.stderr.split())
    assert not (tmp_path / "data").exists()
