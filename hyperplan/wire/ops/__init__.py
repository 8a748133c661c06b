"""SageMaker operation handlers; importing this package registers them all."""

from hyperplan.wire.ops import plans  # noqa: F401
