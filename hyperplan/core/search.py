"""SearchTrainingPlanOfferings for a new plan: priced offerings of 1..K segments, best first.

The rules (docs/DECISIONS.md, "Booking policy"):

* Time is cut into *days* from one 11:30 UTC boundary to the next (``policy.segment_end``). Every
  segment ends on a boundary and holds whole days, except that a segment starting at the *soonest*
  start (``max(StartTimeAfter, now + 30 min)`` rounded up to the minute), when that falls between two
  boundaries, also holds the partial day up to the next boundary. Its DurationHours/Minutes and price
  count that real length. Other segments start on boundaries.
* The segments' whole days add up to D = ceil(DurationHours / 24), within ``[min_days, max_days]``.
* The window: the first segment starts no earlier than the soonest start and no later than
  ``now + horizon`` (56 days); every segment ends by EndTimeBefore, which defaults to ``now + horizon``:
  the default window ``[now + 30 min, now + 56 days]`` holds the whole plan. An EndTimeBefore later
  than ``now + horizon + max_days`` is cut back to that (no plan could use more).
* hyperpod-cluster offerings keep all segments in one pool (one AZ); training-job offerings may take
  each segment from any pool of the type. Two segments of one offering in the same pool are never
  adjacent (that would be one segment), so they never overlap and can be booked one by one.
* Best first, as the fleet's ``policy.ranking`` says (docs/PLANNING.md). ``earliest`` (AWS's order):
  fewest segments, then earliest finish, then lowest price; what follows describes it. ``packing`` (the
  default): fewest segments, then the placement that leaves the calendar best able to take later
  requests (:class:`_Packer`), then earliest finish and price; ``earliest``'s first offering is always
  among those it returns.

Which offerings: the best one is exact. Then variety: the search takes distinct *shapes* (the list of
(start, end) of the segments) in best-first order, so that it returns, say, the same 10 days in AZ a,
the same days with the partial first day added, and 10 days starting a day later, rather than one
shape in three AZs; only when fewer than ``max_offerings`` shapes exist does it add the same shape in
other pools. A split is left out when an offering with fewer segments starts no later and finishes
no later (it would only be a worse copy). The chosen offerings are then sorted best first.
Offerings with k + 1 segments are only looked for while fewer than ``max_offerings`` shapes have been
found with k or fewer (AWS: "if one block does not fit, it tries two").

How (N days in the window, P pools of the type, D days asked for, R runs of open days in a pool):

1. Per pool, the minimum free count over each whole day (the calendar keeps each pool's daily peaks
   between two changes of it: one numpy reduction over the pool's slots after a change, then a slice)
   and whether the partial day is free; a day is *open* if it holds the count. This is all a search
   reads of the calendar (:func:`read_days`, under the live calendar's lock); the rest works on values.
   The calendar keeps what was read, and what the planning derives from it alone (runs of open days,
   their tables, the packing scores' parts, and the offerings planned from them), until it next
   changes (``CapacityCalendar.derived``), keyed by pools, count and window: searches without a window,
   which read the same days, share it, and the same search asked again is not planned again.
   Every pool is one row of the same arrays, so that each step below works on all pools at once.
2. ``first(p, d, j)``: the first day a >= j that opens d open days in a row in pool p. It is j when the
   run of open days from j is long enough, else the start of the first long-enough run after j. Usually
   read from a table of every answer (O(P D N), one numpy pass; one look-up per query); when that table
   would be large (long plans in long windows), from a ``next_run[p, d, r]`` table built from the
   maximal runs (O(P (N + D R)); a few look-ups per query). Either way on whole arrays of queries.
3. One segment: per pool, the first ``max_offerings`` starts ``first(p, D, 0)``, ``first(p, D, a + 1)``...
   Before combining several: each segment lies in one run of open days, so a plan of at most K
   segments needs K runs (of one pool, for a cluster) at least D days long together; without them the
   search stops there, empty (most searches that find nothing).
4. k segments: placing segments earliest-first (greedy) gives the earliest finish for a given list of
   lengths and pools. Level 1 is ``first(p, t, 0)`` for every pool p and length t. The final level k
   combines each level k - 1 prefix (last pool q, t days) with a last segment (pool p, d = D - t days)
   starting at ``first(p, d, end(q, t) + (q == p))``: O(P^2 D) look-ups, all vectorised, and every
   (q, p, d) is a candidate, so for K = 2 both finish and price are exact. Levels between (only when
   K > 2) keep, per (pool, total days), the earliest-finishing prefix, cheapest among those, continuing
   the prefix after which that pool can start soonest: O(P D^2 + P^2 D) per level, linear in K, rather
   than enumerating the compositions of D into K parts (which grow as D^(K-1)). With K > 2 the finish
   stays exact; the price tie-break can miss a cheaper mix of pools with the same finish.
Total: O(P N 48 + P D R + P^2 D) for K = 2; add O(K P D^2) for K > 2.
With P of 1 to 3 and N about 120, the arrays are small and a search's time is mostly the fixed cost of
each numpy call: the code keeps the number of calls low (whole-array steps, results kept per calendar
read) rather than the number of elements. The deeper levels are only computed when the shallower ones
did not give ``max_offerings`` shapes.

Where each part lives, in hyperplan/core: the request and its validation into a window of days
(search_request.py); the days read and what the planning derives from them alone, step 1, ``first`` of
step 2 and the packing score's parts (search_days.py); steps 3 and 4 and the ``earliest`` ranking
(search_plan.py); the ``packing`` ranking (search_rank.py); the offerings returned (offerings.py) and
their prices (pricing.py). This module holds the entry points, which tie them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet
from hyperplan.core.offerings import Offering, Segment
from hyperplan.core.pricing import ONE, segment_price
from hyperplan.core.search_days import _PoolDays
from hyperplan.core.search_plan import _Candidate, _Planner
from hyperplan.core.search_prices import PriceDays
from hyperplan.core.search_rank import _Packer
from hyperplan.core.search_request import SearchRequest, _Query, _query

# -- the search --------------------------------------------------------------------------------------


def search(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> list[Offering]:
    """Offerings for ``request`` at ``now``, best first; at most ``policy.max_offerings``; [] if none
    fits. A ValidationError names the request member that is wrong."""
    return plan_offerings(fleet, read_days(fleet, calendar, request, now))


@dataclass(frozen=True)
class DaysRead:
    """What a search reads from the calendar: its validated query, each pool's days, and what prices
    them beyond the list price (None: nothing does). A value: the calendar may change once it is read,
    and the planning (most of a search's time) needs no lock."""

    query: _Query
    grids: _PoolDays
    prices: PriceDays | None = None


def read_days(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> DaysRead:
    """The first half of :func:`search`: validate the request and read the calendar (a caller that
    shares the calendar between threads holds its lock over this only)."""
    query = _query(fleet, request, now)
    return DaysRead(query, _PoolDays.read(calendar, query), PriceDays.read(fleet, calendar, query))


def plan_offerings(fleet: Fleet, read: DaysRead) -> list[Offering]:
    """The second half of :func:`search`: the offerings, from what :func:`read_days` read.

    The offerings are a function of the days read and the query alone, so they are kept with the days
    (which the calendar keeps until it next changes): the same search asked again before the next
    change (the same type, count, length and target, without a window, in the same minute) is answered
    from there rather than planned again."""
    kept, key = read.grids.plans, (_plan_key(fleet.policy.ranking, read.query), read.prices)
    found = kept.get(key)
    if found is None:
        found = _plan(fleet.policy.ranking, read)
        if len(kept) < _PLANS_KEPT:
            kept[key] = found
    return list(found)


# Per calendar read, the offerings of at most this many searches are kept (a few Offering values each).
_PLANS_KEPT = 64


def _plan_key(ranking: str, query: _Query) -> tuple[object, ...]:
    """Everything the planning reads besides the days: the query, with its pools as what the planning
    reads of them (a pool's node list can be long, and the days read already name the pools)."""
    pools = tuple((pool.key, pool.price_per_instance_hour, pool.currency) for pool in query.pools)
    return (
        ranking,
        query.target,
        query.count,
        query.days,
        pools,
        query.soonest,
        query.first_boundary,
        query.n_days,
        query.latest_start_day,
        query.max_segments,
        query.max_offerings,
        query.days_ahead,
    )


def _plan(ranking: str, read: DaysRead) -> tuple[Offering, ...]:
    planner = _Planner(read.query, read.grids)
    if planner.fits is None:  # the window is shorter than the plan
        return ()
    chosen = _Packer(planner, read.query.days_ahead).best() if ranking == "packing" else planner.best()
    return tuple(_offering(read, candidate) for candidate in chosen)


def _offering(read: DaysRead, candidate: _Candidate) -> Offering:
    """The offering a candidate stands for: its days made times, each segment's price multiplier read
    from its days (core/pricing.py), its fee priced exactly (a candidate's cost is a float, for ranking
    only)."""
    query, prices = read.query, read.prices
    segments, fee = [], Decimal("0.00")
    for index, (pool_index, start_day, stop_day) in enumerate(candidate.segments):
        pool = query.pools[pool_index]
        start = query.soonest if index == 0 and candidate.partial else query.day_start(start_day)
        end = query.day_start(stop_day)
        times = (
            ONE
            if prices is None
            else prices.multiplier(read.grids.free_days, pool_index, start_day, stop_day, query.count)
        )
        segments.append(Segment(pool.key, start, end, query.count, times))
        fee += segment_price(pool, start, end, query.count, times)
    return Offering(query.target, tuple(segments), fee, query.pools[0].currency)
