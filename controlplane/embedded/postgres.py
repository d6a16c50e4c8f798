"""A real Postgres from the pgserver wheel, listening on a unix socket."""
from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from controlplane.embedded.leftovers import PidFile

if TYPE_CHECKING:
    from pgserver.postgres_server import PostgresServer

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """Init-or-reuse a data dir, start, stop and restart a Postgres server.

    Data survives stop/start; `url` is a SQLAlchemy asyncpg URL. A Postgres that an
    earlier run left on the data dir is stopped first (pgserver would connect to it).
    """

    def __init__(self, data_dir: Path | str):
        self.data_dir = Path(data_dir).absolute()       # as /proc shows it: see leftovers
        self._server: Optional[PostgresServer] = None
        # SIGINT: Postgres's fast shutdown (sessions ended, no recovery on the next start)
        self._pid_file = PidFile(self.data_dir / "postmaster.pid", "postgres", "-D", self.data_dir,
                                 signal.SIGINT)

    def start(self) -> "EmbeddedPostgres":
        from pgserver.postgres_server import get_server

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._pid_file.clear_leftover(spare=self.pid)
        if self._server is None:
            # cleanup_mode=None: we decide when it stops, not pgserver's atexit.
            self._server = get_server(self.data_dir, cleanup_mode=None)
        else:
            self._server.ensure_postgres_running()
        log.info("postgres ready at %s", self.libpq_uri)
        return self

    def stop(self) -> None:
        """Fast shutdown (terminates sessions), as an outage would; by its PID when pg_ctl
        fails (pgserver has logged why), so a stop never leaves it running."""
        import pgserver

        if self._server is None or not self.is_running():
            return
        try:
            stop = ["-w", "-m", "fast", "stop"]
            pgserver.pg_ctl(stop, pgdata=self.data_dir,  # type: ignore[attr-defined]  # made per binary
                            user=self._server.system_user, timeout=30)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._pid_file.stop()

    @property
    def pid(self) -> Optional[int]:
        """The postmaster this object started, while it runs (and its pid file names it)."""
        from pgserver.utils import PostmasterInfo

        if self._server is None:
            return None
        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        if info is None or not info.is_running():
            return None
        return info.pid if info.pid == self._server.get_pid() else None

    def is_running(self) -> bool:
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        return info is not None and info.is_running()

    @property
    def libpq_uri(self) -> str:
        assert self._server is not None, "start() first"
        return self._server.get_uri()

    @property
    def url(self) -> str:
        """postgresql+asyncpg://postgres:@/postgres?host=/socket/dir"""
        return self.libpq_uri.replace("postgresql://", "postgresql+asyncpg://", 1)

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc: Optional[BaseException]) -> None:
        self.stop()
