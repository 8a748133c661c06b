"""Every answered request counted and timed (hyperplan/metrics.py), by API and operation: the
SageMaker operation a request names, a native route's method and path template, never a caller's text."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from starlette.responses import Response

from hyperplan import metrics


@contextmanager
def counted_request(api: str, operation: str) -> Iterator[Callable[[Response], Response]]:
    started = time.perf_counter()

    def count(response: Response) -> Response:
        metrics.REQUESTS.labels(api, operation, str(response.status_code)).inc()
        metrics.REQUEST_DURATION.labels(api, operation).observe(time.perf_counter() - started)
        return response

    yield count
