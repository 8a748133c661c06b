"""The change counters several processes sharing one store compare (table change_counters).

A process keeps some of the store's state in memory: the capacity calendar, access keys, the manual
clock. Each transaction that changes such state adds one to its counter (Database.count_changes, in the
same transaction; Database.wrote for rows written with Core statements), and a process reads every
counter in one statement before it relies on what it keeps (at each request: `Database.counters()`); a
value other than the one it last saw means: reload. The other counters wake a loop in another process:
a timed event or a webhook delivery written by any process, a job or node wake, a clock move asked of
the leader (services/runtime/leadership.py polls them).
"""

from __future__ import annotations

CALENDAR = "calendar"  # what plans' segments and unpaid extensions hold (live_calendar.HELD_COLUMNS)
PLANS = "plans"  # plans: their names and statuses, what an account's quota of plans counts
KEYS = "keys"  # access keys, accounts (but their budget), users: whatever a signer's entry carries
SETTINGS = "settings"  # the settings table: the manual clock's time
EVENTS = "events"  # a timed event was scheduled
WEBHOOKS = "webhooks"  # a delivery was queued
JOBS = "jobs"  # a job has work for the runner
NODES = "nodes"  # nodes were provisioned or shut down
CLOCK_MOVES = "clock_moves"  # a clock move was asked of the leader

ALL = (CALENDAR, PLANS, KEYS, SETTINGS, EVENTS, WEBHOOKS, JOBS, NODES, CLOCK_MOVES)
