"""Fixtures shared by the end-to-end tests (one local Slurm cluster per session)."""

from tests.e2e.slurm_cluster import slurm_cluster  # noqa: F401
