"""On-demand use metered per started instance-hour, as values: which hours a holder has started.

A holder (a cluster node, a training job's instances) starts hour 1 when it takes its instances, hour
k at ``started + (k-1) hours``, and starts no hour at or after its end. Each started hour is charged
whole, once (services/clusters/metering.py keeps the count of hours charged).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

HOUR = timedelta(hours=1)


def hours_started(started: datetime, at: datetime, ended: datetime | None = None) -> int:
    """The hours a holder started by ``at``: never fewer than one (the first starts with it), and none
    at or after its end."""
    by_now = max(math.floor((at - started) / HOUR), 0) + 1
    if ended is None:
        return by_now
    return min(by_now, max(math.ceil((ended - started) / HOUR), 1))


def hour_start(started: datetime, hour: int) -> datetime:
    """When hour ``hour`` (1, 2, ...) of a holder started at ``started`` starts."""
    return started + (hour - 1) * HOUR
