"""SageMaker operation handlers; importing this package registers them all."""
