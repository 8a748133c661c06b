"""Prometheus instruments counted where things happen (docs/OPERATIONS.md lists every metric).

What happens in a process is counted here, in that process: requests and their durations (both APIs),
the lifecycle loop's lag, jobs' pending time when they start, webhook deliveries, back-end errors. What
the fleet *is* (pools, plans, jobs, nodes, the work directory's size) is not counted anywhere: a
collector reads it from the store at each scrape (services/orchestration/fleet_metrics.py), in the one process
that serves the metrics listener, so several servers or workers never add their views of one store together.

Several processes (`serve --workers N`): prometheus_client's multiprocess mode. The parent sets
PROMETHEUS_MULTIPROC_DIR to an empty directory before any worker imports this module; each process's
counters and histograms then live in files there, and the listener's registry reads them all through a
MultiProcessCollector (`served_registry`). Nothing here is a Gauge, so no gauge mode has to be chosen.
Without the variable, the instruments count in this process's memory.

A layer of its own beside `worker` and `errors`: it imports nothing of hyperplan, so the event loop,
the dispatcher, the services and the server may all count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

INSTRUMENTS = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "hyperplan_requests",
    "Requests answered, by API (sagemaker, native, console), operation and HTTP status code.",
    ["api", "operation", "code"],
    registry=INSTRUMENTS,
)
REQUEST_DURATION = Histogram(
    "hyperplan_request_duration_seconds",
    "Time from a request's body read to its answer, by API and operation.",
    ["api", "operation"],
    registry=INSTRUMENTS,
)
LIFECYCLE_LAG = Histogram(
    "hyperplan_lifecycle_lag_seconds",
    "Service seconds between a timed event's due time and when it ran.",
    buckets=(0.0, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, float("inf")),
    registry=INSTRUMENTS,
)
JOB_PENDING = Histogram(
    "hyperplan_job_pending_seconds",
    "Service seconds a training job's attempt waited from its creation (or its return to the queue) to "
    "being placed.",
    buckets=(0.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0, float("inf")),
    registry=INSTRUMENTS,
)
SPOT_RECLAIMS = Counter(
    "hyperplan_spot_reclaims",
    "Lent instances taken back from managed spot training jobs for their owner, by whether the promise "
    "was kept: the owner had them by the notice's deadline plus the fleet's kill grace.",
    ["promise"],
    registry=INSTRUMENTS,
)
WEBHOOK_DELIVERIES = Counter(
    "hyperplan_webhook_deliveries",
    "Webhook delivery attempts, by outcome (delivered, failed).",
    ["outcome"],
    registry=INSTRUMENTS,
)
BACKEND_ERRORS = Counter(
    "hyperplan_backend_errors",
    "Errors of the execution back end: a node or a job instance it could not start.",
    registry=INSTRUMENTS,
)


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_VARIABLE))


class _Instruments(Collector):
    """This process's instruments, as one collector of the served registry."""

    def collect(self) -> Iterable[Any]:
        return INSTRUMENTS.collect()


def served_registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    """What the listener serves: every process's instruments (multiprocess mode) or this one's, and the
    given collectors (the fleet's state, read from the store)."""
    registry = CollectorRegistry(auto_describe=True)
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.MultiProcessCollector(registry)
    else:
        registry.register(_Instruments())
    for collector in collectors:
        registry.register(collector)
    return registry


class Listener:
    """The metrics listener: plain HTTP on its own address (Prometheus does not sign its scrapes), in a
    thread of this process; GET /metrics."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=host, registry=registry)
        self._server: Any = server
        self._thread: threading.Thread = thread
        self.port = int(server.server_address[1])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets); ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-listen must be HOST:PORT, e.g. 127.0.0.1:9464; got {text!r}")
    return host.strip("[]"), int(port)
