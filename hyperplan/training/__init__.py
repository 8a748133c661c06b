"""Training jobs as real processes: the SageMaker training contract and each instance's workspace.

``contract`` turns a job into values (directories, config files, variables, a command) and does no I/O;
``workspace`` makes an instance's tree, fetches its inputs through :mod:`hyperplan.objects`, and stores
its model and checkpoints.
"""
