"""A started service has compiled what a purchase runs (plans.compile_ahead): a purchase compiled its
statements at its first, in its write and under its pools' locks, so a new server's first purchases
took several times as long as the next and held up every buyer of their pools meanwhile. Counted here:
the statements compiled for the store's dialect (store/prepared.py) before and after purchases of one
and two segments."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from hyperplan.core.search_request import SearchRequest
from hyperplan.services.plans import plans
from hyperplan.store import prepared
from tests.harness import SERVER_START
from tests.postgres import Stores
from tests.services.running import P5, application, new_account, one_pool_fleet


def _compiled(dialect: str) -> int:
    """How many statement forms this process has compiled for `dialect`."""
    with prepared._MADE_LOCK:
        made = list(prepared._MADE)
    return sum(dialect in statement._forms for statement in made)


def test_a_started_service_buys_without_compiling(tmp_path: Path, stores: Stores) -> None:
    # A pool of 4 of which 3 are held on one day: a plan of 2 for three days within four takes the days
    # around it, in two segments.
    fleet = one_pool_fleet(4, policy="max_segments = 2")
    with application(tmp_path, fleet, database_url=stores.url()) as app:
        runtime = app.context
        dialect = runtime.db.engine.dialect.name
        first, second = new_account(runtime, "first"), new_account(runtime, "second")
        before = _compiled(dialect)
        assert before > 20  # the locks', the rows', the reads' for one and two segments

        day = SERVER_START.replace(hour=11, minute=30) + timedelta(days=3)
        blocker = SearchRequest(P5, 3, 24, "training-job", day + timedelta(days=1), day + timedelta(days=2))
        plans.create(runtime, first, "blocker", plans.search(runtime, first, blocker)[0].offering_id)
        wide = SearchRequest(P5, 2, 72, "training-job", day, day + timedelta(days=4))
        split = [o for o in plans.search(runtime, second, wide) if len(o.offering.segments) == 2]
        assert split, "the search offers the plan in two segments"
        plans.create(runtime, second, "split", split[0].offering_id)

        assert _compiled(dialect) == before
