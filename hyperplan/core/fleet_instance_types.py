"""The fleet file's ``[instance_types]``: each pool's type sized, from AWS's published figures
(``core/instance_types.py``) or the fleet file's own.

A table names a type and gives any of its figures; the others keep their published values::

    [instance_types."ml.p5.48xlarge"]
    memory_gib = 1900                   # what the nodes really have; vcpus and accelerators as AWS's

A type with no published figures must be given all it has: ``vcpus`` and ``memory_gib``, and
``accelerators`` with ``accelerator_kind`` unless it has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hyperplan.core.fleet import Pool
from hyperplan.core.fleet_values import REQUIRED, Table
from hyperplan.core.instance_types import AWS_INSTANCE_TYPES, INSTANCE_TYPE_NAME, InstanceType
from hyperplan.errors import ValidationError

_KEYS = ("vcpus", "memory_gib", "accelerators", "accelerator_kind")
_NEEDED = ("vcpus", "memory_gib")  # what a type without published figures cannot do without


def read_instance_types(values: Mapping[str, Any], pools: tuple[Pool, ...]) -> Mapping[str, InstanceType]:
    """Every type the fleet file sizes or its pools use, by name: the fleet file's figures over AWS's.

    A pool whose type has neither is refused: containers are sized from these figures."""
    catalogue = {name: _instance_type(name, table) for name, table in values.items()}
    for index, pool in enumerate(pools):
        name = pool.instance_type
        if name in catalogue:
            continue
        if name not in AWS_INSTANCE_TYPES:
            raise ValidationError(
                f"pools[{index}].instance_type: {name} has no published figures; size it in a table "
                f'[instance_types."{name}"] with {", ".join(_NEEDED)} (and accelerators, '
                "accelerator_kind if it has any)"
            )
        catalogue[name] = AWS_INSTANCE_TYPES[name]
    return MappingProxyType(catalogue)


def _instance_type(name: str, values: Any) -> InstanceType:
    path = f'instance_types."{name}"'
    if not INSTANCE_TYPE_NAME.fullmatch(name):
        raise ValidationError(f"{path}: {name!r} is not an instance type such as ml.p5.48xlarge")
    if not isinstance(values, dict):
        raise ValidationError(f"{path}: {values!r} is not a table of {', '.join(_KEYS)}")
    table = Table(values, path, _KEYS)
    published = AWS_INSTANCE_TYPES.get(name)
    if published is None:
        missing = [key for key in _NEEDED if key not in values]
        if missing:
            raise table.fail(missing[0], f"required: {name} has no published figures to take it from")
    accelerators = table.integer("accelerators", published.accelerators if published else 0, minimum=0)
    return InstanceType(
        name=name,
        vcpus=table.integer("vcpus", published.vcpus if published else REQUIRED, minimum=1),
        memory_gib=table.integer("memory_gib", published.memory_gib if published else REQUIRED, minimum=1),
        accelerators=accelerators,
        accelerator_kind=_accelerator_kind(table, name, accelerators, published),
    )


def _accelerator_kind(
    table: Table, name: str, accelerators: int, published: InstanceType | None
) -> str | None:
    """The kind given, else the published one; none when the type has no accelerators (an override of
    ``accelerators = 0`` takes the published kind away with them)."""
    if "accelerator_kind" not in table.values:
        kind = published.accelerator_kind if published and accelerators else None
        if accelerators and kind is None:
            raise table.fail("accelerator_kind", f"required: {name} has {accelerators} accelerators")
        return kind
    kind = table.text("accelerator_kind")
    if not kind.strip():
        raise table.fail("accelerator_kind", "is empty (name the kind, such as NVIDIA H100)")
    if not accelerators:
        raise table.fail("accelerator_kind", f"{kind!r} given, but {name} has no accelerators")
    return kind
