"""The embedded stack behind `thawpool up`: Postgres and S3 unless external ones are given.

It holds the data dir's lock from start to stop, so what it finds running there is a
leftover of an earlier run (stopped by EmbeddedPostgres/EmbeddedS3 before they start),
never the servers of another live `up`."""
from __future__ import annotations

import logging
from typing import Optional

from controlplane.embedded import EmbeddedPostgres, EmbeddedS3
from controlplane.embedded.data_dir_lock import DataDirLock
from controlplane.settings import Settings

log = logging.getLogger("thawpool.stack")


class EmbeddedStack:
    """Starts what `settings` does not point elsewhere; data lives under settings.data_dir,
    so a second start on the same data dir finds everything again."""

    def __init__(self, settings: Settings):
        self.requested = settings
        self.postgres: Optional[EmbeddedPostgres] = None
        self.s3: Optional[EmbeddedS3] = None
        self.lock = DataDirLock(settings.data_dir)

    def claim(self) -> None:
        """Take the data dir; DataDirInUse while another `up` runs on it."""
        self.requested.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock.take()

    def start(self) -> Settings:
        settings = self.requested
        self.claim()
        try:
            if not settings.database_url:
                self.postgres = EmbeddedPostgres(settings.data_dir / "postgres").start()
                settings = settings.replace(database_url=self.postgres.url)
            if settings.s3_endpoint == "aws":          # AWS S3 itself: no endpoint override
                settings = settings.replace(s3_endpoint=None)
            elif not settings.s3_endpoint:
                self.s3 = EmbeddedS3(settings.data_dir / "s3").start()
                self.s3.ensure_bucket(settings.models_bucket)     # tenants upload into it
                settings = settings.replace(s3_endpoint=self.s3.endpoint,
                                            aws_access_key_id=self.s3.access_key,
                                            aws_secret_access_key=self.s3.secret_key)
        except BaseException:
            self.stop()
            raise
        return settings

    def stop(self) -> None:
        """Stops every child this stack started, S3 first, each even if another fails,
        then lets go of the data dir."""
        for service in (self.s3, self.postgres):
            if service is None:
                continue
            try:
                service.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping %s failed", type(service).__name__)
        self.s3 = self.postgres = None
        self.lock.release()
