"""CreateCluster and UpdateCluster, decoded once at the wire edge into the frozen values the services keep.

Decoding checks nothing: the rules (a group's instance type, its plan, its zone, unique names) stay in
``services/clusters/clusters.py``, in the order they have always run, some of them against the store. The
store keeps each group's specification and the cluster's settings as they were given (JSON); ``to_json`` and
``from_json`` write and read that form, so stores written before this module read the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hyperplan.core.jsonable import jsonable

# The cluster-wide members kept as given (DescribeCluster echoes them).
SETTINGS = ("VpcConfig", "Orchestrator", "NodeRecovery")


@dataclass(frozen=True)
class LifeCycle:
    """LifeCycleConfig: where the group's lifecycle scripts are, and which one runs when a node is made."""

    source_uri: str | None = None
    on_create: str | None = None


@dataclass(frozen=True)
class InstanceGroupSpec:
    """One ClusterInstanceGroupSpecification. `instance_type` is None when the request left it out (the
    service refuses that, naming the group). `override_subnets` is None when the group does not override
    the cluster's VpcConfig. `as_given` is the specification as it was given (JSON-ready): what the store
    keeps and DescribeCluster echoes; treat it as read-only."""

    name: str
    instance_type: str | None
    instance_count: int
    plan_arn: str | None
    lifecycle: LifeCycle
    override_subnets: tuple[str, ...] | None
    capacity_requirements: bool
    as_given: Mapping[str, Any]
    volume_gb: int | None = None
    """InstanceStorageConfigs' EbsVolumeConfig.VolumeSizeInGB (the secondary volume, /opt/sagemaker)."""

    @classmethod
    def from_wire(cls, spec: Mapping[str, Any]) -> InstanceGroupSpec:
        config = spec.get("LifeCycleConfig") or {}
        override = spec.get("OverrideVpcConfig")
        return cls(
            name=spec["InstanceGroupName"],
            instance_type=spec.get("InstanceType"),
            instance_count=spec["InstanceCount"],
            plan_arn=spec.get("TrainingPlanArn") or None,
            lifecycle=LifeCycle(config.get("SourceS3Uri") or None, config.get("OnCreate")),
            override_subnets=tuple(override.get("Subnets", [])) if override else None,
            capacity_requirements="CapacityRequirements" in spec,
            as_given=jsonable(spec),
            volume_gb=_volume_gb(spec),
        )

    @classmethod
    def from_json(cls, text: str) -> InstanceGroupSpec:
        return cls.from_wire(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.as_given)


def _volume_gb(spec: Mapping[str, Any]) -> int | None:
    for config in spec.get("InstanceStorageConfigs") or ():
        volume = config.get("EbsVolumeConfig") or {}
        if not volume.get("RootVolume") and volume.get("VolumeSizeInGB"):
            return int(volume["VolumeSizeInGB"])
    return None


@dataclass(frozen=True)
class ClusterSettings:
    """The cluster-wide members of CreateCluster (VpcConfig, Orchestrator, NodeRecovery) as given."""

    as_given: Mapping[str, Any]

    @classmethod
    def from_wire(cls, request: Mapping[str, Any]) -> ClusterSettings:
        return cls(jsonable({member: request[member] for member in SETTINGS if member in request}))

    @classmethod
    def from_json(cls, text: str) -> ClusterSettings:
        return cls(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.as_given)

    @property
    def subnets(self) -> tuple[str, ...]:
        return tuple((self.as_given.get("VpcConfig") or {}).get("Subnets", []))

    @property
    def recovers_nodes(self) -> bool:
        """HyperPod's automatic node recovery: a failed node is replaced unless NodeRecovery is None
        (Automatic, SageMaker's default, when the request did not say)."""
        return self.as_given.get("NodeRecovery") != "None"


@dataclass(frozen=True)
class ClusterSpec:
    """A CreateCluster request."""

    name: str
    groups: tuple[InstanceGroupSpec, ...]
    settings: ClusterSettings

    @classmethod
    def from_wire(cls, request: Mapping[str, Any]) -> ClusterSpec:
        return cls(
            name=request["ClusterName"],
            groups=_groups(request),
            settings=ClusterSettings.from_wire(request),
        )


@dataclass(frozen=True)
class ClusterUpdate:
    """An UpdateCluster request: the groups to add or change, and the groups to delete."""

    name: str
    groups: tuple[InstanceGroupSpec, ...]
    groups_to_delete: tuple[str, ...]

    @classmethod
    def from_wire(cls, request: Mapping[str, Any]) -> ClusterUpdate:
        return cls(
            name=request["ClusterName"],
            groups=_groups(request),
            groups_to_delete=tuple(request.get("InstanceGroupsToDelete") or ()),
        )


def _groups(request: Mapping[str, Any]) -> tuple[InstanceGroupSpec, ...]:
    return tuple(InstanceGroupSpec.from_wire(spec) for spec in request.get("InstanceGroups") or [])
