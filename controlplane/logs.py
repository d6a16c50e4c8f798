"""Structured JSON log lines; fields passed as `extra=` become keys."""
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Optional, TextIO

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
                "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str = "INFO", stream: Optional[TextIO] = None) -> None:
    """JSON lines on stderr for the `thawpool` loggers (called by the CLI, not on import)."""
    # the logging HOWTO's optimizations: no caller frame lookup, no thread or process
    # names (the JSON lines carry none of them), about a tenth of each line's cost
    logging._srcfile = None  # documented there
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("thawpool")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
