"""The size of each instance type: its vCPUs, memory and accelerators.

A fleet file may give any type's figures (``[instance_types."ml.p5.48xlarge"]``, read by
``fleet_instance_types``); without them a type takes AWS's published figures from the table below. The
containers that run tenant work are sized from these figures, so a type with none is refused when the
fleet file is read rather than guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

INSTANCE_TYPE_NAME = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9-]+")
"""How a SageMaker instance type is spelt: ``ml.<family>.<size>``."""


@dataclass(frozen=True)
class InstanceType:
    """One instance type's size. A CPU-only type has ``accelerators == 0`` and no ``accelerator_kind``."""

    name: str
    vcpus: int
    memory_gib: int
    accelerators: int = 0  # GPUs or AWS ML chips (Trainium) per instance
    accelerator_kind: str | None = None  # such as "NVIDIA H100" or "AWS Trainium2"


# AWS's published figures, per instance: (vCPUs, memory in GiB, accelerators, their kind). The names are
# those botocore's SageMaker model accepts for training jobs and HyperPod clusters (TrainingInstanceType,
# ClusterInstanceType) in the families the demo and bench fleets use. Where the figures come from: the
# Amazon EC2 User Guide's hardware specification tables (M5, C5, T3, G5, P4d, P4de, Trn1); the EC2
# Capacity Blocks pricing page (P5, P5e, P4d, Trn1); the Amazon ECS Developer Guide's table of Neuron
# devices (Trn1, Trn2); the Neuron SDK's Trn1/Trn1n architecture page (Trn1n). P5e's vCPUs and P5en's
# figures are from instance catalogues built on EC2's DescribeInstanceTypes (TorchX's named AWS
# resources, dstack's offers), which agree with the P5 figures above.
_H100, _H200, _A100, _A100_80GB = "NVIDIA H100", "NVIDIA H200", "NVIDIA A100", "NVIDIA A100 80GB"
_A10G, _TRAINIUM, _TRAINIUM2 = "NVIDIA A10G", "AWS Trainium", "AWS Trainium2"
_PUBLISHED: tuple[tuple[str, int, int, int, str | None], ...] = (
    # -- accelerated: the types training plans reserve
    ("ml.p5.48xlarge", 192, 2048, 8, _H100),
    ("ml.p5e.48xlarge", 192, 2048, 8, _H200),
    ("ml.p5en.48xlarge", 192, 2048, 8, _H200),
    ("ml.p4d.24xlarge", 96, 1152, 8, _A100),  # 40 GB A100s
    ("ml.p4de.24xlarge", 96, 1152, 8, _A100_80GB),
    ("ml.trn2.48xlarge", 192, 2048, 16, _TRAINIUM2),
    ("ml.trn1.32xlarge", 128, 512, 16, _TRAINIUM),
    ("ml.trn1n.32xlarge", 128, 512, 16, _TRAINIUM),
    ("ml.trn1.2xlarge", 8, 32, 1, _TRAINIUM),
    # -- G5: NVIDIA A10G
    ("ml.g5.xlarge", 4, 16, 1, _A10G),
    ("ml.g5.2xlarge", 8, 32, 1, _A10G),
    ("ml.g5.4xlarge", 16, 64, 1, _A10G),
    ("ml.g5.8xlarge", 32, 128, 1, _A10G),
    ("ml.g5.12xlarge", 48, 192, 4, _A10G),
    ("ml.g5.16xlarge", 64, 256, 1, _A10G),
    ("ml.g5.24xlarge", 96, 384, 4, _A10G),
    ("ml.g5.48xlarge", 192, 768, 8, _A10G),
    # -- CPU only: general purpose (M5), compute optimised (C5), burstable (T3)
    ("ml.m5.large", 2, 8, 0, None),
    ("ml.m5.xlarge", 4, 16, 0, None),
    ("ml.m5.2xlarge", 8, 32, 0, None),
    ("ml.m5.4xlarge", 16, 64, 0, None),
    ("ml.m5.8xlarge", 32, 128, 0, None),
    ("ml.m5.12xlarge", 48, 192, 0, None),
    ("ml.m5.16xlarge", 64, 256, 0, None),
    ("ml.m5.24xlarge", 96, 384, 0, None),
    ("ml.c5.large", 2, 4, 0, None),
    ("ml.c5.xlarge", 4, 8, 0, None),
    ("ml.c5.2xlarge", 8, 16, 0, None),
    ("ml.c5.4xlarge", 16, 32, 0, None),
    ("ml.c5.9xlarge", 36, 72, 0, None),
    ("ml.c5.12xlarge", 48, 96, 0, None),
    ("ml.c5.18xlarge", 72, 144, 0, None),
    ("ml.c5.24xlarge", 96, 192, 0, None),
    ("ml.t3.medium", 2, 4, 0, None),
    ("ml.t3.large", 2, 8, 0, None),
    ("ml.t3.xlarge", 4, 16, 0, None),
    ("ml.t3.2xlarge", 8, 32, 0, None),
)

AWS_INSTANCE_TYPES: Mapping[str, InstanceType] = MappingProxyType(
    {name: InstanceType(name, vcpus, memory, count, kind) for name, vcpus, memory, count, kind in _PUBLISHED}
)
"""The built-in catalogue: each type's AWS figures, by name."""
