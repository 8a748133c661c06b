"""Operation handlers (SageMaker's, CloudWatch Logs', STS's); importing this package registers them all."""

from hyperplan.wire.ops import clusters, jobs, logs, plans, sts, tags  # noqa: F401
