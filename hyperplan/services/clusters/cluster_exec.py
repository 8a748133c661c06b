"""A command run on a Running node of a cluster, with a cap on the output the answer carries."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

from hyperplan.backends.base import EXEC_OUTPUT_LIMIT, BackendError, ExecResult, NodeUnavailable
from hyperplan.core.status import NodeStatus
from hyperplan.errors import Conflict, ResourceNotFound, ServiceUnavailable, ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters.cluster_records import get, nodes_of
from hyperplan.services.runtime.context import ServiceContext

EXEC_OUTPUT_LIMIT_ENV = "HYPERPLAN_EXEC_OUTPUT_LIMIT"


MAX_EXEC_OUTPUT_LIMIT = 64 << 20  # the answer carries both streams as JSON text, in one response


def exec_output_limit(env: Mapping[str, str] | None = None) -> int:
    """Bytes of each of stdout and stderr an exec returns: HYPERPLAN_EXEC_OUTPUT_LIMIT in the server's
    environment, 1 MiB by default. Output beyond it is dropped (the answer says so), so that a chatty
    command cannot make the server hold it all."""
    text = (os.environ if env is None else env).get(EXEC_OUTPUT_LIMIT_ENV)
    if not text:
        return EXEC_OUTPUT_LIMIT
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_EXEC_OUTPUT_LIMIT:
        raise ValidationError(
            f"The server's {EXEC_OUTPUT_LIMIT_ENV}={text!r} is not a number of bytes from 1 to "
            f"{MAX_EXEC_OUTPUT_LIMIT}; its administrator must fix it."
        )
    return int(text)


def running_node(runtime: ServiceContext, caller: Caller, cluster_name: str, node_ref: str) -> str:
    """The back end's id of the caller's node (by instance id or host name) in a cluster, if it runs: a
    short read, before the command's long wait (`run_on_node`)."""
    with runtime.db.read() as session:
        cluster = get(session, runtime, caller, cluster_name)
        node = next((n for n in nodes_of(session, cluster) if node_ref in (n.instance_id, n.hostname)), None)
        if node is None:
            raise ResourceNotFound(f"Cluster {cluster.name} has no node {node_ref}.")
        if node.status != NodeStatus.RUNNING:
            raise Conflict(f"Node {node.instance_id} is {node.status}; commands run on Running nodes only.")
        return node.backend_id


def run_on_node(
    runtime: ServiceContext, backend_id: str, node_ref: str, argv: list[str], timeout: timedelta
) -> ExecResult:
    """The command run on the node found by `running_node`, waited for up to `timeout`: this blocks for
    as long as the tenant's command runs, so it belongs on an exec thread (services/runtime/exec_slots.py),
    never on the threads every request shares."""
    try:
        return runtime.backend.exec(backend_id, argv, timeout, output_limit=exec_output_limit())
    except NodeUnavailable as refused:  # it stopped running meanwhile, or the command was lost
        raise Conflict(f"Node {node_ref}: {refused}") from None
    except BackendError as failed:  # the cluster did not answer in time (say, slurmctld restarting)
        raise ServiceUnavailable(
            f"Node {node_ref}: the command could not be run now ({failed}); try again."
        ) from None
