"""Instants a test can start its service clock at, chosen to be awkward for the rules of time.

Segments start and end at 11:30 UTC, the soonest start is 30 minutes from now (so a plan bought just
before or after 11:00 straddles a boundary), a plan bought late in the day holds a partial first day,
and days, months and years roll over under a 56-day horizon. The tests that touch these rules run at
each instant through `at_awkward_instants`; the slow server tests run once, at tests.harness.SERVER_START.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

AWKWARD_INSTANTS = {
    "00:05": datetime(2027, 3, 10, 0, 5, tzinfo=UTC),  # just past midnight: a long partial first day
    "11:25": datetime(2027, 3, 10, 11, 25, tzinfo=UTC),  # the soonest start passes the 11:30 boundary
    "11:35": datetime(2027, 3, 10, 11, 35, tzinfo=UTC),  # just past the boundary: almost a whole day more
    "23:55": datetime(2027, 3, 10, 23, 55, tzinfo=UTC),  # the soonest start is tomorrow
    "month-end": datetime(2027, 2, 28, 23, 55, tzinfo=UTC),  # ... and in the next month
}

at_awkward_instants = pytest.mark.parametrize(
    "start_instant", list(AWKWARD_INSTANTS.values()), ids=list(AWKWARD_INSTANTS)
)
"""Run a test once per awkward instant, given as its `start_instant` argument."""
