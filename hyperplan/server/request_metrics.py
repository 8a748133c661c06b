"""Every answered request counted and timed (hyperplan/metrics.py), by API and operation: the
SageMaker operation a request names, a native route's method and path template, never a caller's text."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.responses import Response

from hyperplan import metrics


@contextmanager
def counted_request(api: str, operation: str) -> Iterator[Callable[[Response], Response]]:
    started = time.perf_counter()

    def count(response: Response) -> Response:
        count_answer(api, operation, response.status_code, started)
        return response

    yield count


def count_answer(api: str, operation: str, status: int, started: float) -> None:
    """One answer of `status` counted, and the time since `started` (time.perf_counter) observed."""
    answered, duration = _instruments(api, operation, status)
    answered.inc()
    duration.observe(time.perf_counter() - started)


def _instruments(api: str, operation: str, status: int) -> tuple[Any, Any]:
    """The labelled counter and histogram, kept: `labels()` takes a lock and builds its key each time,
    a good share of a request's bookkeeping. The labels are bounded (an operation is one of the model's
    or "unknown", a native route's template), so the cache is too."""
    key = (api, operation, status)
    found = _LABELLED.get(key)
    if found is None:
        found = (
            metrics.REQUESTS.labels(api, operation, str(status)),
            metrics.REQUEST_DURATION.labels(api, operation),
        )
        _LABELLED[key] = found
    return found


_LABELLED: dict[tuple[str, str, int], tuple[Any, Any]] = {}
