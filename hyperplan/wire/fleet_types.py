"""Instance types outside AWS's lists: which types exist is the fleet's to say.

The model lists the instance types of a training plan, a training job and a HyperPod instance group
(eleven, 225 and 209 of them); a fleet has a handful of those, and may have types of its own. A value
spelt as an instance type therefore passes the model's list, in requests (wire/validate.py) and in
answers (wire/serialize.py), and the services check it against the fleet, whose refusal lists the
fleet's own types (core/served_types.py) rather than AWS's. Anything else is held to the list, as AWS
holds it.
"""

from __future__ import annotations

from hyperplan.core.instance_types import INSTANCE_TYPE_NAME

FLEET_INSTANCE_TYPES = frozenset(
    {"ReservedCapacityInstanceType", "TrainingInstanceType", "ClusterInstanceType"}
)
# AWS's longest instance type is 21 characters; the service quotes a type back in its refusal.
MAX_INSTANCE_TYPE_LENGTH = 64


def left_to_the_fleet(shape_name: str, value: str) -> bool:
    """Whether a value of the string shape ``shape_name`` outside the model's list is the fleet's to
    judge: an instance type of those lists, spelt as one, of the length such a name has."""
    return (
        shape_name in FLEET_INSTANCE_TYPES
        and len(value) <= MAX_INSTANCE_TYPE_LENGTH
        and INSTANCE_TYPE_NAME.fullmatch(value) is not None
    )
