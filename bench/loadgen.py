"""The load generator: client *processes*, each with one pre-opened keep-alive HTTP/1.1 connection, each
signing its own requests with the CLI's SigV4 signer (``hyperplan.signing``, not botocore's, whose own
cost per call would dominate what is measured).

A phase starts every client process, lets each prepare (connect, warm up, maybe search for offerings to
buy later, then sign and frame the requests it will send: `Client`), releases them together through a
barrier, and collects per-request latencies and outcomes.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import queue
import random
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench import mix
from hyperplan.signing import sign_request

SERVICE = "sagemaker"
CONTENT_TYPE = "application/x-amz-json-1.1"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    region: str
    access_key: str
    secret_key: str


def signed_headers(endpoint: Endpoint, target: str, body: bytes, when: datetime) -> dict[str, str]:
    """The headers of one signed awsJson1.1 POST /, signed as the CLI signs (hyperplan.signing)."""
    return sign_request(
        "POST",
        f"http://{endpoint.host}:{endpoint.port}/",
        headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": target},
        body=body,
        access_key=endpoint.access_key,
        secret_key=endpoint.secret_key,
        region=endpoint.region,
        service=SERVICE,
        now=when,
    )


@dataclass(frozen=True)
class Prepared:
    """One request, signed and framed ahead of its sending: the bytes that go on the wire."""

    operation: str
    data: bytes


class Client:
    """One keep-alive connection to the SageMaker endpoint, spoken to over a plain socket.

    The load generator shares the machine with the server it measures: every microsecond of a client's
    CPU, and every cache line it dirties, is taken from the server (on this 2-core machine a request's
    handler, called in-process, cost 2.5 times its own CPU with four busy processes beside it). So the
    timed part of a phase does
    as little as it can: requests are signed and framed before it (`prepare`; the server still checks
    every signature, and its clock-skew window spans any phase), a response is read by its
    Content-Length with no HTTP library, and its body is parsed only when the caller needs it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.host = f"{endpoint.host}:{endpoint.port}"
        self.socket: socket.socket | None = None
        self.pending = b""  # bytes read past the last response (none, from a server that waits)

    def prepare(self, operation: str, payload: dict[str, Any]) -> Prepared:
        body = json.dumps(payload).encode()
        headers = signed_headers(self.endpoint, f"SageMaker.{operation}", body, datetime.now(UTC))
        lines = [f"POST / HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items() if name.lower() != "host")
        return Prepared(operation, ("".join(lines) + "\r\n").encode("latin-1") + body)

    def send(self, request: Prepared) -> tuple[str, bytes]:
        """(outcome, response body): the outcome is "ok", the error's ``__type``, or a transport error."""
        try:
            status, content = self._exchange(request.data)
        except (OSError, ValueError) as exc:
            self.close()  # reopened by the next request
            return f"transport: {type(exc).__name__}", b""
        if status == 200:
            return "ok", content
        try:
            parsed = json.loads(content) if content else {}
        except ValueError:  # not the wire's JSON error (a 500's plain text)
            parsed = {}
        return str(parsed.get("__type", f"HTTP {status}")), content

    def call(self, operation: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(outcome, parsed response body)."""
        outcome, content = self.send(self.prepare(operation, payload))
        return outcome, (json.loads(content) if content else {})

    def _exchange(self, data: bytes) -> tuple[int, bytes]:
        if self.socket is None:
            self.socket = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=120)
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.pending = b""
        self.socket.sendall(data)
        received = self.pending
        while (end := received.find(b"\r\n\r\n")) < 0:
            received += self._recv()
        head, received = received[:end].lower(), received[end + 4 :]
        status = int(head[9:12])
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise ValueError("a response without Content-Length")
        line_end = head.find(b"\r\n", at + 17)
        length = int(head[at + 17 : line_end if line_end >= 0 else len(head)])
        while len(received) < length:
            received += self._recv()
        self.pending = received[length:]
        if b"\r\nconnection: close" in head:
            self.close()
        return status, received[:length]

    def _recv(self) -> bytes:
        assert self.socket is not None
        chunk = self.socket.recv(1 << 16)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        return chunk

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


# -- what each client does ---------------------------------------------------------------------------


@dataclass
class Tally:
    """One client's record: latencies of completed calls per operation, outcomes, and when it ran."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # the same latencies by (operation, outcome): a purchase bought and one refused take different paths
    by_outcome: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    cpu: float = 0.0  # this client's CPU seconds over the timed part

    def timed_send(self, client: Client, request: Prepared, *, parse: bool = False) -> dict[str, Any]:
        """Send a prepared request, timed; its parsed body when asked for and answered "ok", else {}."""
        began = time.perf_counter()
        outcome, content = client.send(request)
        took = time.perf_counter() - began
        self.latencies.setdefault(request.operation, []).append(took)
        self.by_outcome.setdefault((request.operation, outcome), []).append(took)
        self.outcomes[(request.operation, outcome)] += 1
        return json.loads(content) if parse and outcome == "ok" else {}

    def timed_call(self, client: Client, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Prepare (untimed), then send (timed); the parsed body when answered "ok", else {}."""
        return self.timed_send(client, client.prepare(operation, payload), parse=True)


@dataclass(frozen=True)
class ClientJob:
    kind: str  # "search", "search_buy" or "buy"
    index: int
    endpoint: Endpoint
    context: mix.MixContext
    duration: float  # seconds of timed work; a "buy" client also stops when its offerings run out
    limit: int | None = None  # at most this many timed iterations
    offerings: int = 0  # "buy": offerings to search for before the timed part
    tag: str = ""  # names this phase's plans (and seeds its requests), so that phases never collide

    @property
    def name(self) -> str:
        return f"{self.tag or self.kind}-{self.index}".replace("_", "-")  # a valid TrainingPlanName


COMPLETED = ("ok", "ResourceLimitExceeded")
SEARCH = "SearchTrainingPlanOfferings"
CREATE = "CreateTrainingPlan"


PREPARED_PER_SECOND = 400
"""Requests a client prepares before the timed part, per second of it: more than one client is answered
in a second here (~150/s each, with eight); past them, it prepares each as it goes."""


def _ahead(job: ClientJob, make: Callable[[], Prepared]) -> Iterator[Prepared]:
    """Requests made now, before the timed part, as many as it can send; then made as they are needed.
    Each is a new one of the mix, never a repeat, so the server's caches see what they would see."""
    count = int(job.duration * PREPARED_PER_SECOND)
    made = [make() for _ in range(count if job.limit is None else min(count, job.limit))]
    return itertools.chain(made, iter(make, None))


def _searching(job: ClientJob, client: Client, rng: random.Random, tally: Tally) -> Callable[[], bool]:
    searches = _ahead(
        job, lambda: client.prepare(SEARCH, mix.wire_search(mix.search_request(rng, job.context)))
    )

    def step() -> bool:
        tally.timed_send(client, next(searches))
        return True

    return step


def _searching_and_buying(
    job: ClientJob, client: Client, rng: random.Random, tally: Tally
) -> Callable[[], bool]:
    names = iter(range(10**9))
    searches = _ahead(
        job, lambda: client.prepare(SEARCH, mix.wire_search(mix.purchase_request(rng, job.context)))
    )

    def step() -> bool:
        found = tally.timed_send(client, next(searches), parse=True)
        offerings = found.get("TrainingPlanOfferings", [])
        if not offerings:
            tally.outcomes[(CREATE, "skipped: no offering")] += 1
            return True
        _buy(tally, client, f"{job.name}-{next(names)}", offerings[0])
        return True

    return step


def _buying(job: ClientJob, client: Client, rng: random.Random, tally: Tally) -> Callable[[], bool]:
    """Search first (untimed), then buy the first offering of each search. Every search starts from a
    random day: searched all at once, offerings from the window's start would all overlap."""
    stock = []
    for _ in range(job.offerings):
        _, found = client.call(
            SEARCH, mix.wire_search(mix.purchase_request(rng, job.context, spread_share=1.0))
        )
        stock.extend(found.get("TrainingPlanOfferings", [])[:1])
    orders = [_order(client, f"{job.name}-{number}", offering) for number, offering in enumerate(stock)]
    orders.reverse()

    def step() -> bool:
        if not orders:
            return False
        tally.timed_send(client, orders.pop())
        return True

    return step


def _order(client: Client, name: str, offering: dict[str, Any]) -> Prepared:
    payload = {"TrainingPlanName": name, "TrainingPlanOfferingId": offering["TrainingPlanOfferingId"]}
    return client.prepare(CREATE, payload)


def _buy(tally: Tally, client: Client, name: str, offering: dict[str, Any]) -> None:
    tally.timed_send(client, _order(client, name, offering))


_KINDS = {"search": _searching, "search_buy": _searching_and_buying, "buy": _buying}


def run_client(job: ClientJob, barrier: Any, results: Any) -> None:
    """The body of one client process."""
    rng = random.Random(job.name)
    client = Client(job.endpoint)
    warm = Tally()
    for _ in range(5):  # a warm connection and a warm server, before anything is timed
        warm.timed_call(client, SEARCH, mix.wire_search(mix.search_request(rng, job.context)))
    tally = Tally()
    step = _KINDS[job.kind](job, client, rng, tally)
    barrier.wait(timeout=600)
    cpu_before = time.process_time()
    tally.started = time.time()
    deadline = tally.started + job.duration
    done = 0
    while time.time() < deadline and (job.limit is None or done < job.limit) and step():
        done += 1
    tally.finished = time.time()
    tally.cpu = time.process_time() - cpu_before
    client.close()
    results.put(tally)


# -- a phase -----------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    clients: int
    wall: float  # from the first client's start to the last client's finish
    latencies: dict[str, list[float]]
    outcomes: Counter[tuple[str, str]]
    clients_cpu: float  # CPU seconds of every client over the timed part
    server_cpu: float = 0.0  # CPU seconds of the server over the same span, when measured
    by_outcome: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # latencies

    def completed(self, operation: str) -> int:
        """Requests answered as the benchmark means them to be: success, or a purchase refused because
        another client took the capacity first. Anything else is a failure, left out of the rates."""
        return sum(
            n for (op, outcome), n in self.outcomes.items() if op == operation and outcome in COMPLETED
        )

    def failed(self, operation: str) -> int:
        return sum(
            n
            for (op, outcome), n in self.outcomes.items()
            if op == operation and outcome not in COMPLETED and not outcome.startswith("skipped")
        )

    def rate(self, operation: str) -> float:
        return self.completed(operation) / self.wall if self.wall > 0 else 0.0

    def breakdown(self, operation: str) -> str:
        parts = [f"{outcome} {n:,}" for (op, outcome), n in sorted(self.outcomes.items()) if op == operation]
        return ", ".join(parts) or "none"


def run_phase(
    jobs: list[ClientJob], server_cpu: Callable[[], float] = lambda: 0.0, timeout: float = 600
) -> PhaseResult:
    """Run one client process per job, released together once all are ready; wait for all of them.
    ``server_cpu`` is read when they are released and again when the last one is done."""
    context = mp.get_context("spawn")
    barrier = context.Barrier(len(jobs) + 1)  # and this process, to read the server's CPU at the start
    results = context.Queue()
    processes = [context.Process(target=run_client, args=(job, barrier, results)) for job in jobs]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=timeout)
        cpu_at_start = server_cpu()
        tallies = _collect(results, processes, timeout)
        cpu_used = server_cpu() - cpu_at_start
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    result = _merge(tallies)
    result.server_cpu = cpu_used
    return result


def _collect(results: Any, processes: list[Any], timeout: float) -> list[Tally]:
    """Every client's tally; a client that dies without one is an error, not a hang."""
    tallies: list[Tally] = []
    deadline = time.monotonic() + timeout
    while len(tallies) < len(processes):
        try:
            tallies.append(results.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"load generator clients failed (exit codes {dead})") from None
    return tallies


def _merge(tallies: list[Tally]) -> PhaseResult:
    latencies: dict[str, list[float]] = {}
    by_outcome: dict[tuple[str, str], list[float]] = {}
    outcomes: Counter[tuple[str, str]] = Counter()
    for tally in tallies:
        for operation, values in tally.latencies.items():
            latencies.setdefault(operation, []).extend(values)
        for key, values in tally.by_outcome.items():
            by_outcome.setdefault(key, []).extend(values)
        outcomes.update(tally.outcomes)
    wall = max(t.finished for t in tallies) - min(t.started for t in tallies)
    return PhaseResult(
        len(tallies), wall, latencies, outcomes, sum(t.cpu for t in tallies), by_outcome=by_outcome
    )
