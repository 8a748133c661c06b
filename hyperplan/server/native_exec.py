"""The native exec route: a command run on a Running node of one of the caller's clusters.

The one request that waits on a tenant's process (up to TimeoutSeconds, an hour at most), so the one
that must not wait on a thread every other request needs (anyio's pool, shared by every handler): the
call is admitted or refused at once (services/runtime/exec_slots.py: an account's limit, ThrottlingException;
the process's total, ServiceUnavailable), the node is looked up on the shared pool (a short read), and
the command is waited for on a thread of its own while the request itself only awaits a future.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from hyperplan.backends.base import ExecResult
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.clusters import cluster_exec

DEFAULT_EXEC_SECONDS = 300
MAX_EXEC_SECONDS = 3600
MAX_COMMAND_ARGUMENTS = 1024
MAX_COMMAND_ARGUMENT_LENGTH = 32 * 1024


async def exec_on_node(request: NativeRequest) -> dict[str, Any]:
    command = fields.text_list(
        request.body, "Command", max_items=MAX_COMMAND_ARGUMENTS, max_length=MAX_COMMAND_ARGUMENT_LENGTH
    )
    timeout = fields.whole(request.body, "TimeoutSeconds", 1, MAX_EXEC_SECONDS) or DEFAULT_EXEC_SECONDS
    runtime, node_ref = request.runtime, request.path["node"]
    slot = runtime.exec_slots.take(request.caller, runtime.fleet.exec_limits)
    try:
        backend_id = await run_in_threadpool(
            cluster_exec.running_node, runtime, request.caller, request.path["cluster"], node_ref
        )
    except BaseException:  # no such node, not Running, or the request cancelled: no command starts
        slot.release()
        raise
    work = partial(
        cluster_exec.run_on_node, runtime, backend_id, node_ref, command, timedelta(seconds=timeout)
    )
    # From here the slot is the thread's: given back when the command has ended, so that a request that
    # stops waiting (its client gone, the server stopping) never frees a slot whose thread still runs.
    running = slot.run(work, name=f"exec-{request.caller.account_id}")
    return _answer(await asyncio.wrap_future(running))


def _answer(result: ExecResult) -> dict[str, Any]:
    return {
        "ExitCode": result.exit_code,
        "Stdout": result.stdout.decode(errors="replace"),
        "Stderr": result.stderr.decode(errors="replace"),
        "TimedOut": result.timed_out,
        "StdoutTruncated": result.stdout_truncated,  # the output went on past the server's limit
        "StderrTruncated": result.stderr_truncated,
    }


def routes() -> list[Route]:
    return [
        NativeRoute(
            "POST",
            "/api/v1/clusters/{cluster}/nodes/{node}/exec",
            exec_on_node,
            body=("Command", "TimeoutSeconds"),
        ),
    ]
