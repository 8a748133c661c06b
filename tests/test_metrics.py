"""hyperplan/metrics.py under prometheus_client's multiprocess mode (serve --workers N): what several
processes counted is served once, added up, by the listener's registry; and --metrics-listen's value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hyperplan.metrics import parse_listen

COUNT = """
from hyperplan import metrics
metrics.REQUESTS.labels("sagemaker", "ListTrainingPlans", "200").inc()
metrics.LIFECYCLE_LAG.observe(0.0)
"""

SERVE = """
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from hyperplan import metrics
text = generate_latest(metrics.served_registry([])).decode()
for family in text_string_to_metric_families(text):
    for sample in family.samples:
        if sample.name in ("hyperplan_requests_total", "hyperplan_lifecycle_lag_seconds_count"):
            print(sample.name, sample.value)
"""


def _python(code: str, multiproc_dir: Path) -> str:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_workers_counts_are_served_added_up(tmp_path: Path) -> None:
    for _ in range(2):  # two worker processes, each counting once
        _python(COUNT, tmp_path)
    served = dict(line.split() for line in _python(SERVE, tmp_path).splitlines())
    assert float(served["hyperplan_requests_total"]) == 2
    assert float(served["hyperplan_lifecycle_lag_seconds_count"]) == 2


def test_metrics_listen_takes_host_and_port_and_names_what_is_wrong() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    for bad in ("9464", "localhost:", ":9464", "host:99999", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen(bad)
