"""The fleet file's ``[image_map]`` and ``[registries]``: where training images are pulled from
(core/image_refs.py has the grammar and the rules of the map)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hyperplan.core.fleet_values import Table
from hyperplan.core.image_refs import ImageSources, Registry, build_image_map, parse_registry_host
from hyperplan.errors import ValidationError


def read_image_sources(image_map: Mapping[str, Any], registries: Mapping[str, Any]) -> ImageSources:
    return ImageSources(build_image_map(image_map), _read_registries(registries))


def _read_registries(values: Mapping[str, Any]) -> Mapping[str, Registry]:
    """``[registries."HOST[:PORT]"] insecure = true``: one table per registry."""
    found: dict[str, Registry] = {}
    for key, settings in values.items():
        where = f'registries."{key}"'
        try:
            host = parse_registry_host(key)
        except ValidationError as error:
            raise ValidationError(f"{where}: {error.message}") from None
        if host in found:
            raise ValidationError(f"{where}: the same registry as another key (host names ignore case)")
        if not isinstance(settings, dict):
            raise ValidationError(f"{where}: {settings!r} is not a table (such as {{ insecure = true }})")
        table = Table(settings, where, ("insecure",))
        found[host] = Registry(host, table.get("insecure", bool, False, "true or false"))
    return MappingProxyType(found)
