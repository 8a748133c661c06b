"""Fair share: one account's search latency, alone and beside another account's search flood.

Two real servers on the bench fleet, one after the other: one whose rate limits are out of reach (what
a flood does unchecked) and one with the built-in defaults (search: 10 a second, a burst of 50). On each,
account A makes searches one after another, first alone, then while account B floods searches from
several processes; B's throttled requests are counted. A keeps to half its search limit (a team's steady
use), B does not. The figures: A's median and p95 latency in each case, how many of A's searches were
served, and how much of B's flood was.

Then on-demand capacity: on two more servers, without an on-demand quota and with the demo's (each
account at most half of a type's on-demand instances), account B creates one-node on-demand clusters
until it is refused, then account A asks for one node. The figures: how many of the pool's on-demand
instances B took, and whether A's request was served (and how long it took).
"""

from __future__ import annotations

import multiprocessing
import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Client, Endpoint
from bench.report import Figure, Report, heading, line, percentile
from bench.scale import Scale
from bench.server import FLEET, HOST, running_server
from hyperplan.backends.local import LocalBackend
from hyperplan.cli.client import NativeClient, credentials_from_file
from hyperplan.signing import Credentials

SEARCH = {
    "InstanceType": "ml.p5.48xlarge",
    "InstanceCount": 2,
    "DurationHours": 48,
    "TargetResources": ["training-job"],
}
FLOOD_PROCESSES = 4
A_PER_SECOND = 5.0  # half the built-in search limit: A never needs to be throttled


def run(report: Report, workdir: Path, *, scale: Scale) -> None:
    heading(f"Fair share: account A's searches, alone and beside account B's {FLOOD_PROCESSES}-process flood")
    searches = scale.pick(100, 40, 8)
    unlimited = FLEET.read_text()
    limited = re.sub(r"\n\[rate_limits\]\n(.+\n)*", "\n", unlimited)  # the built-in defaults
    for label, fleet_text in (("no rate limits", unlimited), ("default rate limits", limited)):
        directory = workdir / f"fairness-{label.replace(' ', '-')}"
        directory.mkdir(parents=True)
        fleet = directory / "fleet.toml"
        fleet.write_text(fleet_text)
        with running_server(directory / "data", fleet=fleet) as server:
            admin = NativeClient(server_url(server.port), _admin_credentials(directory / "data"))
            region = admin.server_region()
            a, b = (_endpoint(admin, name, server.port, region) for name in ("fair-a", "fair-b"))
            alone = _latencies(a, searches)
            flood = _Flood(b)
            flood.start()
            try:
                beside = _latencies(a, searches)
            finally:
                served, throttled = flood.stop()
        for case, seconds in (("alone", alone), ("beside the flood", beside)):
            median, p95 = statistics.median(seconds) * 1000, percentile(seconds, 95) * 1000
            line(
                f"{label}, A {case}: median {median:.1f} ms, p95 {p95:.1f} ms "
                f"({len(seconds)} of {len(seconds)} searches served, {A_PER_SECOND:g} a second)"
            )
            report.add(Figure(f"search latency of A {case}, {label}", f"{median:.1f} ms median"))
        share = served / max(1, served + throttled)
        line(f"{label}: B's flood: {served} searches served, {throttled} throttled ({share:.0%} served)")
        report.add(Figure(f"B's flood served, {label}", f"{served} of {served + throttled}"))
    _on_demand(report, workdir, scale)


ON_DEMAND_TYPE = "ml.m5.12xlarge"  # on-demand only in the bench fleet
ON_CREATE = "#!/bin/sh\ntrue\n"


def _on_demand(report: Report, workdir: Path, scale: Scale) -> None:
    pool = scale.pick(16, 8, 4)
    heading(
        f"Fair share on demand: B takes one-node clusters until refused, then A asks for one ({pool} in "
        "the pool)"
    )
    base = re.sub(
        r"(instance_type = \"ml\.m5\.12xlarge\"\nzone = \"[^\"]+\"\ncount = )\d+",
        rf"\g<1>{pool}",
        FLEET.read_text(),
    )
    half = base.replace("\n[quotas]\n", "\n[quotas]\nmax_on_demand_share_per_type = 0.5\n")
    assert half != base, "the bench fleet has a [quotas] table"
    for label, fleet_text in (("no on-demand quota", base), ("half of a type each", half)):
        directory = workdir / f"fairness-on-demand-{label.replace(' ', '-')}"
        directory.mkdir(parents=True)
        fleet = directory / "fleet.toml"
        fleet.write_text(fleet_text)
        data_dir = directory / "data"
        script = data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
        script.parent.mkdir(parents=True)
        script.write_text(ON_CREATE)
        try:
            with running_server(data_dir, fleet=fleet) as server:
                admin = NativeClient(server_url(server.port), _admin_credentials(data_dir))
                admin.post("/api/v1/buckets/lifecycle/grants", {"Account": "*", "ReadOnly": True})
                region = admin.server_region()
                a, b = (_endpoint(admin, name, server.port, region) for name in ("od-a", "od-b"))
                taken = _take_until_refused(b, pool)
                outcome, seconds = _one_cluster(a, "a-0")
        finally:  # nodes outlive their server by design: end every process this one started
            LocalBackend(data_dir.with_name(data_dir.name + "-work") / "backend").adopt([])
        served = f"served in {seconds * 1000:.0f} ms" if outcome == "ok" else "refused"
        line(
            f"{label}: B took {taken} of {pool} on-demand {ON_DEMAND_TYPE}; "
            f"A's one node: {served} ({outcome})"
        )
        report.add(Figure(f"on-demand instances B took, {label}", f"{taken} of {pool}"))
        report.add(Figure(f"A's on-demand node after B's flood, {label}", served))


def _take_until_refused(endpoint: Endpoint, pool: int) -> int:
    taken = 0
    while taken <= pool:  # one past the pool: the last is always refused
        outcome, _ = _one_cluster(endpoint, f"b-{taken}")
        if outcome != "ok":
            break
        taken += 1
    return taken


def _one_cluster(endpoint: Endpoint, name: str) -> tuple[str, float]:
    group = {
        "InstanceGroupName": "g",
        "InstanceType": ON_DEMAND_TYPE,
        "InstanceCount": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
        "ExecutionRole": "arn:aws:iam::123456789012:role/bench",
    }
    client = Client(endpoint)
    try:
        began = time.perf_counter()
        outcome, _ = client.call("CreateCluster", {"ClusterName": name, "InstanceGroups": [group]})
        return outcome, time.perf_counter() - began
    finally:
        client.close()


def server_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def _admin_credentials(data_dir: Path) -> Credentials:
    found = credentials_from_file(data_dir / "credentials")
    assert found is not None, "the server wrote no credentials file"
    return found


def _endpoint(admin: NativeClient, name: str, port: int, region: str) -> Endpoint:
    key = admin.post("/api/v1/accounts", {"Name": name})
    return Endpoint(HOST, port, region, key["AccessKeyId"], key["SecretAccessKey"])


def _latencies(endpoint: Endpoint, count: int) -> list[float]:
    """A's searches at A_PER_SECOND, each one's latency; any search of A refused fails the bench."""
    client = Client(endpoint)
    try:
        seconds = []
        due = time.perf_counter()
        for _ in range(count):
            due += 1 / A_PER_SECOND
            began = time.perf_counter()
            outcome, body = client.call("SearchTrainingPlanOfferings", SEARCH)
            seconds.append(time.perf_counter() - began)
            if outcome != "ok":
                raise RuntimeError(f"account A's search failed: {outcome} {body}")
            time.sleep(max(0.0, due - time.perf_counter()))
        return seconds
    finally:
        client.close()


class _Flood:
    """Processes searching as fast as they can until stopped, counting what was served and throttled.

    Processes, not threads: threads would share the bench's interpreter lock with A's timer, and A's
    latency would measure the bench's own contention rather than the server's.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._served = context.Value("q", 0)
        self._throttled = context.Value("q", 0)
        self._processes = [
            context.Process(target=_search, args=(endpoint, self._stop, self._served, self._throttled))
            for _ in range(FLOOD_PROCESSES)
        ]

    def start(self) -> None:
        for process in self._processes:
            process.start()
        time.sleep(1.0)  # under way (spawned and searching) before A starts measuring

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        for process in self._processes:
            process.join(timeout=120)
            if process.is_alive():
                process.kill()
                process.join()
        return int(self._served.value), int(self._throttled.value)


def _search(endpoint: Endpoint, stop: Any, served: Any, throttled: Any) -> None:
    client = Client(endpoint)
    try:
        while not stop.is_set():
            outcome, _ = client.call("SearchTrainingPlanOfferings", SEARCH)
            throttled_here = outcome.endswith("ThrottlingException")
            counter = served if outcome == "ok" else throttled if throttled_here else None
            if counter is not None:
                with counter.get_lock():
                    counter.value += 1
    finally:
        client.close()
