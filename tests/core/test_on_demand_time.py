"""On-demand work next to reservations on a Slurm fleet, as values (hyperplan/slurm/on_demand_time.py):
the limit it is submitted with, the limit it is cut to when a reservation lands on its node later, and
when the service ends it (docs/SLURM.md, "On-demand work")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hyperplan.services.slurm.slurm_on_demand import LEAD
from hyperplan.slurm.on_demand_time import MARGIN, Ahead, shortened_limit, taken, time_limit

NOW = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


def test_work_is_submitted_without_a_limit_unless_a_reservation_is_ahead() -> None:
    assert time_limit([], NOW) is None  # runs on, as on the local back end (not the partition's DefaultTime)
    assert time_limit([NOW + DAY], NOW) == DAY - MARGIN
    assert time_limit([NOW + DAY, NOW + 3 * MINUTE + DAY, NOW + 10 * MINUTE], NOW) == 8 * MINUTE
    # One too close to leave a minute before the margin does not cut the work to Slurm's minimum: Slurm
    # places nothing on its nodes that would run into it anyway.
    assert time_limit([NOW + MARGIN + 30 * timedelta(seconds=1)], NOW) is None
    assert time_limit([NOW + MARGIN + 30 * timedelta(seconds=1), NOW + DAY], NOW) == DAY - MARGIN
    assert time_limit([NOW + MARGIN + MINUTE], NOW) == MINUTE


def test_a_reservation_made_later_cuts_the_work_on_its_nodes_to_end_before_it() -> None:
    began = NOW - 10 * MINUTE
    # Without a limit (or one ending after the margin): whole minutes from its start, ending in time.
    assert shortened_limit(began, None, NOW + DAY, NOW, LEAD) == (DAY - MARGIN + 10 * MINUTE) // MINUTE
    odd = NOW + DAY + 30 * timedelta(seconds=1)
    assert shortened_limit(began, None, odd, NOW, LEAD) == (DAY - MARGIN + 10 * MINUTE) // MINUTE
    assert shortened_limit(began, NOW + 2 * DAY, NOW + DAY, NOW, LEAD) is not None
    # Already ending in time: nothing to do (so a pass after the cut changes nothing).
    assert shortened_limit(began, NOW + DAY - MARGIN, NOW + DAY, NOW, LEAD) is None
    assert shortened_limit(began, NOW + MINUTE, NOW + DAY, NOW, LEAD) is None
    # The reservation is near: the service ends the work, with its grace, rather than Slurm.
    assert shortened_limit(began, None, NOW + LEAD, NOW, LEAD) is None
    assert shortened_limit(began, None, NOW + LEAD + MINUTE, NOW, LEAD) == 11


def test_on_demand_work_is_ended_once_the_reservation_on_its_node_is_within_the_lead() -> None:
    """The wall clock's decision (a manual clock's too, its service time turned into real time): an
    on-demand node 2.5 minutes before the reservation that takes its Slurm node."""
    assert (LEAD - MARGIN).total_seconds() == 30  # the nodes' grace between SIGTERM and SIGKILL
    second = timedelta(seconds=1)
    ahead = [
        Ahead("hp-111111111111-a-rc1", ("hp-n05", "hp-n06"), NOW + LEAD + second),
        Ahead("hp-222222222222-b-rc1", ("hp-n07",), None),  # started
        Ahead("hp-333333333333-c-rc1", ("hp-n08",), NOW - MINUTE),  # started (the wall clock's start)
    ]
    assert taken(ahead, NOW, LEAD) == {"hp-n07": "hp-222222222222-b-rc1", "hp-n08": "hp-333333333333-c-rc1"}
    assert taken(ahead, NOW + second, LEAD) == {
        "hp-n05": "hp-111111111111-a-rc1",
        "hp-n06": "hp-111111111111-a-rc1",
        "hp-n07": "hp-222222222222-b-rc1",
        "hp-n08": "hp-333333333333-c-rc1",
    }
    # A node two reservations name (one ending as the next starts) goes to the earlier.
    later = Ahead("hp-444444444444-d-rc2", ("hp-n07",), NOW + MINUTE)
    assert taken([later, *ahead], NOW, LEAD)["hp-n07"] == "hp-222222222222-b-rc1"
    assert taken([], NOW, LEAD) == {}
