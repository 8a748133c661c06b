"""One search across instance types: each type searched as SearchTrainingPlanOfferings searches it
(core/search.py), the answers merged into one order (docs/DECISIONS.md, "Booking policy").

The order, best first:

1. fewest segments;
2. the fleet's ranking within a type: an offering's position in its own type's answer (so the types'
   first offerings come before their second ones, whichever ranking the fleet uses);
3. the earliest finish (the last segment's end);
4. the lowest price (the upfront fee);
5. the order the types were asked in, so that equal offerings always come out the same way.

Each type's answer holds at most the fleet's ``max_offerings``, as a search of that type alone would.
The requests share duration, target and window; each type has its own count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

from hyperplan.core.offerings import Offering
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import HyperplanError, ResourceLimitExceeded, ValidationError

MAX_TYPES = 8
"""Instance types one search may ask for."""

Found = TypeVar("Found")


def merged(answers: Sequence[Sequence[Found]], offering_of: Callable[[Found], Offering]) -> list[Found]:
    """Every item of ``answers`` (one list per type, in the order the types were asked, each best first)
    in the merged order above. ``offering_of`` reads the offering an item stands for (a signed one, in
    the services)."""
    ranked = [
        (_rank(offering_of(item), position, type_index), item)
        for type_index, answer in enumerate(answers)
        for position, item in enumerate(answer)
    ]
    ranked.sort(key=lambda pair: pair[0])
    return [item for _, item in ranked]


def _rank(offering: Offering, position: int, type_index: int) -> tuple[int, int, datetime, Decimal, int]:
    return (len(offering.segments), position, offering.end, offering.upfront_fee, type_index)


def check_requests(requests: Sequence[SearchRequest]) -> None:
    """Refuse what no search across types may ask: no type, more than :data:`MAX_TYPES`, a type twice,
    or requests that differ in anything but type and count (one duration, target and window for all)."""
    if not 1 <= len(requests) <= MAX_TYPES:
        raise ValidationError(
            f"InstanceTypes must hold 1 to {MAX_TYPES} instance types; it holds {len(requests)}."
        )
    seen: set[str] = set()
    for request in requests:
        if request.instance_type in seen:
            raise ValidationError(
                f"InstanceTypes: {request.instance_type} is given twice; give each type once."
            )
        seen.add(request.instance_type)
    shared = {_shared(request) for request in requests}
    if len(shared) > 1:
        raise ValidationError(
            "InstanceTypes: every type is searched with the same DurationHours, TargetResources, "
            "StartTimeAfter and EndTimeBefore."
        )


def _shared(request: SearchRequest) -> tuple[object, ...]:
    return (request.duration_hours, request.target, request.start_after, request.end_before)


def naming_type(refusal: HyperplanError, instance_type: str) -> HyperplanError:
    """A type's refusal as a search across types gives it: the same error, its message naming the type
    it is about (a count or a quota of one type among several) when it does not already."""
    if not isinstance(refusal, ValidationError | ResourceLimitExceeded) or instance_type in refusal.message:
        return refusal
    return type(refusal)(f"For {instance_type}: {refusal.message}")
