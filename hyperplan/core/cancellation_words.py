"""A cancellation policy as every edge shows it: the words a person reads beside an offering or a plan,
and the JSON the native API carries (docs/RETURNS.md).

The policy itself, its tiers and its arithmetic, are core/returns.py's; this module only decides how
it is said, once, so that the native API, the CLI (which prints the API's words) and the console agree.
A policy that allows no return says so plainly, as SageMaker's plans are: final.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hyperplan.core.fleet import Fleet, PoolKey
from hyperplan.core.returns import CancellationPolicy


def policy_words(policy: CancellationPolicy) -> str:
    """One line: the policy's own description, or, when it allows no return, that none is possible."""
    if not policy.allows_returns:
        return f"No returns ({policy.name}: as SageMaker, plans are final)"
    return policy.describe()


def policy_json(policy: CancellationPolicy) -> dict[str, Any]:
    """The machine-readable policy (CancellationPolicy.as_json) with its words as `Description`."""
    return {**policy.as_json(), "Description": policy_words(policy)}


def policy_for(fleet: Fleet, pool_key: PoolKey) -> CancellationPolicy:
    """The policy of the pool an offering's or a plan's segment is in (the pool's own, else the fleet's)."""
    instance_type, zone = pool_key
    return fleet.cancellation_for(instance_type, zone)


def policies_for(fleet: Fleet, pool_keys: Iterable[PoolKey]) -> list[CancellationPolicy]:
    """The distinct policies of these pools, in the order first met: one for nearly every plan, more
    only when a plan's segments lie in pools whose policies differ."""
    found: list[CancellationPolicy] = []
    for key in pool_keys:
        policy = policy_for(fleet, key)
        if policy not in found:
            found.append(policy)
    return found
