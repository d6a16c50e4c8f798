"""Embedded services for one machine: Postgres (pgserver) and S3 (SeaweedFS).

`thawpool up` and the test fixtures both use these; production points the
same code at RDS and AWS S3 instead.
"""
from controlplane.embedded.postgres import EmbeddedPostgres
from controlplane.embedded.s3 import EmbeddedS3

__all__ = ["EmbeddedPostgres", "EmbeddedS3"]
