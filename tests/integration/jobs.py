"""Test helpers: the job driver lives in the package (`elastrain.chaos.job`)."""

from elastrain.chaos.job import EXAMPLE, REPO, TRAIN_SAMPLES, ElasticJob, Host, assert_exactly_once, hosts

__all__ = ["EXAMPLE", "REPO", "TRAIN_SAMPLES", "ElasticJob", "Host", "assert_exactly_once", "hosts"]
