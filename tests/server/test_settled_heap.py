"""A serving process leaves what it built at startup out of the garbage collector's later passes
(hyperplan/server/serving.py settle_heap): a full pass over it stopped every request in progress for
80-200 ms under load. Run in a process of its own: freezing this test process's heap would keep every
later test's cycles for good."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request

_SERVE = """
import gc, sys
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from hyperplan.server import serving

async def frozen(request):
    return PlainTextResponse(str(gc.get_freeze_count()))

app = Starlette(routes=[Route("/frozen", frozen)])
serving.serve(lambda: None, app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_started_server_has_frozen_what_it_built() -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)])
    try:
        frozen = int(_get(f"http://127.0.0.1:{port}/frozen", time.monotonic() + 60))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # The modules imported (uvicorn, Starlette, hyperplan's server) alone are tens of thousands.
    assert frozen > 10_000


def test_a_process_that_never_serves_freezes_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import gc, hyperplan.server.serving; print(gc.get_freeze_count())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0"
