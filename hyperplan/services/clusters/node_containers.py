"""A HyperPod node as a container (runtime ``podman``): the fleet's node image, the cluster account's ids,
its instance type's limits, and the server's endpoint inside.

A node's container is made by its agent as it is provisioned (``backends/containers.py``), pulling the image
when the store does not have it yet, while the node is Pending, as an instance boots its AMI (with the
registry's sealed login, if an administrator set one); a pull or a start that fails fails the node, saying
why. Its disk (``backends/disks.py``) is its instance group's EbsVolumeConfig.VolumeSizeInGB, else the
fleet's ``[backend] node_disk_gb``: the node's ``/opt/sagemaker`` (where HyperPod mounts that volume),
``/tmp`` and ``/var/tmp``. Each node is a pod of its own: a cluster's nodes talk to each other through the
server (S3, the API), never directly, as on the host before containers.
"""

from __future__ import annotations

from hyperplan.backends.base import ContainerSpec, IdMap, Login
from hyperplan.backends.disks import GIB
from hyperplan.backends.images import ImageUnavailable
from hyperplan.core.image_refs import parse_image
from hyperplan.services.accounts import registry_credentials
from hyperplan.services.runtime import tenancy
from hyperplan.services.runtime.containment import limits_for
from hyperplan.services.runtime.context import ServiceContext


def node_image_login(runtime: ServiceContext) -> Login | None:
    """The sealed login of the node image's registry, if an administrator set one: the agent pulls with
    it (as a job's image is pulled with its registry's)."""
    image = runtime.fleet.backend.node_image
    if runtime.images is None or image is None:
        return None
    return registry_credentials.login_for(runtime.db, runtime.secret_box, parse_image(image).registry_host)


def node_container(
    runtime: ServiceContext, cluster_id: int, instance_type: str, zone: str | None, volume_gb: int | None
) -> ContainerSpec | None:
    """The container a node of this cluster and type runs as; None where nodes are host processes."""
    if runtime.images is None:
        return None
    backend = runtime.fleet.backend
    image = backend.node_image
    if image is None:
        raise ImageUnavailable(
            "the fleet names no image for HyperPod nodes ([backend] node_image), and nodes run in "
            "containers here (runtime podman)"
        )
    host = parse_image(image).registry_host
    return ContainerSpec(
        image=image,
        ids=_ids(runtime, cluster_id),
        limits=limits_for(runtime, instance_type, zone),
        endpoint=runtime.settings.endpoint,
        insecure_registry=runtime.fleet.image_sources.insecure(host),
        disk_bytes=(volume_gb or backend.node_disk_gb) * GIB if runtime.settings.bounded_disks else None,
    )


def _ids(runtime: ServiceContext, cluster_id: int) -> IdMap:
    """The account's block of ids (Podman); on Slurm its user's own id, all rootless runc maps."""
    if runtime.slurm is None:
        return tenancy.cluster_container_ids(runtime, cluster_id)
    user = tenancy.cluster_run_as(runtime, cluster_id)
    assert user is not None  # the Slurm back end runs in isolation mode users
    return IdMap(user.uid, 1)
