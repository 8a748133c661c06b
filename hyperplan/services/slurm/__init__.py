"""The Slurm back end's reconcilers: plans' segments as Slurm reservations, on-demand nodes. Imports
services/jobs and below."""
