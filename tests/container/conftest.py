"""The local Slurm cluster of tests/e2e (one per session) for the container tests."""

from tests.support.slurm_cluster import slurm_cluster  # noqa: F401
