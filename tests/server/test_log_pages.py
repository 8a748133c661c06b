"""Log pages bounded in bytes (issue 42): a job that printed 200 MB is read through CloudWatch Logs
(boto3: GetLogEvents forward and backward, FilterLogEvents) and the native API's timed lines, and no
page holds more than 1 MiB of messages (core/page_bytes.py), while every line comes exactly once.

A real server on the local back end: the job's program writes its lines through the timed log's wrapper,
as any job's do. Its lines are numbered, and of three kinds so that both of a page's bounds are met:
15,000 tiny ones first (a page of them ends at 10,000 events), then 3,100 of 63 to 65 KB (half of them
of a three-byte character, so that a page counted in characters rather than bytes would pass 1 MiB),
each followed by two of 300 bytes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from hyperplan.backends.local import LocalBackend
from hyperplan.core.log_events import EVENT_OVERHEAD
from hyperplan.core.page_bytes import MAX_PAGE_BYTES
from hyperplan.signing import Credentials
from tests.harness import ADMIN, REGION, Server, wait_until

pytestmark = pytest.mark.aws

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
GROUP = "/aws/sagemaker/TrainingJobs"
TINY = 15_000
BIG = 3_100
TOTAL = TINY + 3 * BIG  # 24,300 lines, 200.5 MB

LINES = f"""
import sys

TINY, TOTAL = {TINY}, {TOTAL}


def line(n):
    if n < TINY:
        return "%07d tiny" % n
    big, kind = divmod(n - TINY, 3)
    if kind:
        return "%07d " % n + "s" * 292
    return "%07d " % n + ("\\u20ac" * 21_000 if big % 2 else "x" * 65_000)


out = sys.stdout
for n in range(TOTAL):
    out.write(line(n) + "\\n")
"""


_RULE: dict[str, Any] = {}
exec(LINES.split("\n\nout = ")[0], _RULE)  # the program's `line`, without its loop


def _line(n: int) -> str:
    """Line `n` as the job writes it (its program above: the same rule)."""
    return str(_RULE["line"](n))


def _number(message: str) -> int:
    return int(message[:7])


def _weight(events: list[dict[str, Any]]) -> int:
    """What a page's events weigh: their messages' UTF-8 bytes and 26 each (core/log_events.py)."""
    return sum(len(event["message"].encode()) + EVENT_OVERHEAD for event in events)


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server and its finished job "loud", whose one instance printed the 200 MB."""
    directory = tmp_path_factory.mktemp("log-pages")
    (directory / "data" / "s3" / "bucket" / "input").mkdir(parents=True)
    (directory / "data" / "s3" / "bucket" / "input" / "data.csv").write_text("1,2\n")
    program = directory / "lines.py"
    program.write_text(LINES)
    server = Server(data_dir=directory / "data", fleet=SMALL_FLEET)
    try:
        server.start()
        server.sagemaker().create_training_job(**_job("loud", [sys.executable, str(program)]))
        done = wait_until(
            lambda: (
                server.sagemaker().describe_training_job(TrainingJobName="loud")["TrainingJobStatus"]
                in ("Completed", "Failed", "Stopped")
            ),
            timeout=300,
        )
        job = server.sagemaker().describe_training_job(TrainingJobName="loud")
        assert done and job["TrainingJobStatus"] == "Completed", (job, server.log()[-3000:])
        stream = f"loud/algo-1-{int(job['CreationTime'].timestamp())}"
        yield {"server": server, "stream": stream, "rss": [_rss(server)]}
        assert "Traceback" not in server.log(), server.log()[-5000:]
    finally:
        if server.process is not None:
            LocalBackend(server.work_dir / "backend").adopt([])
        server.close()


def _job(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": command,
        },
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://bucket/input",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _logs(server: Server, who: Credentials = ADMIN) -> Any:
    return boto3.client(
        "logs",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=who.access_key,
        aws_secret_access_key=who.secret_key,
        config=Config(retries={"max_attempts": 1}, read_timeout=300),
    )


def _rss(server: Server) -> dict[str, int]:
    """The server process's resident memory now and at its peak, in KiB (for the report: not asserted)."""
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}


class Reading:
    """Pages read one after another: each checked against the bound, its lines' numbers kept."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.numbers: list[int] = []
        self.pages: list[int] = []  # each page's weight
        self.started = time.monotonic()

    def page(self, events: list[dict[str, Any]]) -> None:
        weight = _weight(events)
        assert weight <= MAX_PAGE_BYTES, (self.what, len(self.pages), weight)
        assert len(events) <= 10_000
        for event in events:
            number = _number(event["message"])
            assert event["message"] == _line(number), (self.what, number)
            self.numbers.append(number)
        self.pages.append(weight)

    def report(self, server: Server) -> None:
        print(
            f"\n{self.what}: {len(self.pages)} pages, largest {max(self.pages):,} bytes, "
            f"{time.monotonic() - self.started:.1f} s, server RSS {_rss(server)} KiB"
        )


def test_get_log_events_reads_200_mb_forward_a_page_of_at_most_1_mib_at_a_time(
    printed: dict[str, Any],
) -> None:
    server, stream = printed["server"], printed["stream"]
    logs = _logs(server)
    reading = Reading("get-log-events forward")
    page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)
    while True:
        reading.page(page["events"])
        following = logs.get_log_events(
            logGroupName=GROUP, logStreamName=stream, nextToken=page["nextForwardToken"]
        )
        if following["events"]:
            # Cut where the bound fell: the next page's first event would not have fitted on this one.
            cut_by_bytes = _weight(page["events"]) + _weight(following["events"][:1]) > MAX_PAGE_BYTES
            assert cut_by_bytes or len(page["events"]) == 10_000, len(reading.pages)
        elif following["nextForwardToken"] == page["nextForwardToken"]:
            break  # the end: the token comes back unchanged, as AWS's does
        page = following
    assert reading.numbers == list(range(TOTAL))
    assert reading.pages[0] < MAX_PAGE_BYTES and len(reading.pages) > 190  # 10,000 tiny lines, then ~1 MiB
    reading.report(server)


def test_get_log_events_reads_200_mb_backward_a_page_of_at_most_1_mib_at_a_time(
    printed: dict[str, Any],
) -> None:
    server, stream = printed["server"], printed["stream"]
    logs = _logs(server)
    reading = Reading("get-log-events backward")
    pages: list[list[int]] = []
    forward_tokens: list[str] = []
    token: str | None = None
    while True:
        asked = {"nextToken": token} if token else {}
        page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=False, **asked)
        if not page["events"] and page["nextBackwardToken"] == token:
            break
        reading.page(page["events"])
        pages.append([_number(event["message"]) for event in page["events"]])
        forward_tokens.append(page["nextForwardToken"])
        token = page["nextBackwardToken"]
    assert [number for page in reversed(pages) for number in page] == list(range(TOTAL))
    assert len(pages) > 190
    # A backward page's forward token goes on right after its last event.
    for at in (1, len(pages) // 2, len(pages) - 1):
        after = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, nextToken=forward_tokens[at])
        assert _number(after["events"][0]["message"]) == pages[at][-1] + 1
    reading.report(server)


def test_filter_log_events_reads_200_mb_a_page_of_at_most_1_mib_at_a_time(printed: dict[str, Any]) -> None:
    server, stream = printed["server"], printed["stream"]
    logs = _logs(server)
    reading = Reading("filter-log-events")
    asked: dict[str, str] = {}
    while True:
        page = logs.filter_log_events(logGroupName=GROUP, logStreamNames=[stream], **asked)
        reading.page(page["events"])
        if "nextToken" not in page:
            break
        asked = {"nextToken": page["nextToken"]}
    assert reading.numbers == list(range(TOTAL))
    # A filter pattern keeps its pages to the bound too: the big lines of the three-byte character.
    euros = Reading("filter-log-events, a pattern")
    asked = {}
    while True:
        page = logs.filter_log_events(logGroupName=GROUP, filterPattern="\u20ac\u20ac\u20ac", **asked)
        euros.page(page["events"])
        if "nextToken" not in page:
            break
        asked = {"nextToken": page["nextToken"]}
    assert euros.numbers == [n for n in range(TINY, TOTAL) if (n - TINY) % 6 == 3]
    reading.report(server)


def test_the_native_timed_lines_come_a_page_of_at_most_1_mib_at_a_time(printed: dict[str, Any]) -> None:
    server = printed["server"]
    client = server.native()
    numbers: list[int] = []
    largest, pages, cursor = 0, 0, None
    while True:
        page = client.get(
            "/api/v1/training-jobs/loud/logs", host="algo-1", stream="stdout", timed="true", cursor=cursor
        )
        weight = sum(len(line["Text"].encode()) + 64 for line in page["Lines"])  # services/jobs/job_logs.py
        assert weight <= MAX_PAGE_BYTES and len(page["Lines"]) <= 1000, (pages, weight)
        largest, pages = max(largest, weight), pages + 1
        for line in page["Lines"]:
            assert line["Text"] == _line(_number(line["Text"]))
            numbers.append(_number(line["Text"]))
        if page["Done"]:
            break
        cursor = page["Cursor"]
    assert numbers == list(range(TOTAL))
    print(f"\nnative timed lines: {pages} pages, largest {largest:,} bytes, server RSS {_rss(server)} KiB")
    # The bytes as written come 64 KiB a page (services/jobs/job_logs.py: LOG_PAGE), far under the bound.
    first = client.get("/api/v1/training-jobs/loud/logs", host="algo-1", stream="stdout")
    assert 0 < len(first["Data"].encode()) <= 64 * 1024 and not first["Done"]
    print(f"server RSS after the job, before any read: {printed['rss'][0]} KiB")
