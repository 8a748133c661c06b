"""SageMaker operation handlers; importing this package registers them all."""

from hyperplan.wire.ops import clusters, jobs, plans, tags  # noqa: F401
