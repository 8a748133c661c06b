"""`hyperplan clock show`: the service's time and its kind of clock, as the server has them (a manual clock
reads only what it was moved to, whatever the hour the test runs at). Its --json is tested with the client
options (test_against_a_server.py)."""

from __future__ import annotations

from tests.inprocess import InProcessServer


def test_clock_show_prints_the_service_time_and_the_kind_of_clock(fast_server: InProcessServer) -> None:
    fast_server.set_clock("2027-01-05T07:45:00Z")
    assert fast_server.cli("clock", "show").stdout == "2027-01-05T07:45:00Z  (manual clock)\n"
