"""Access-log capture for TestClient tests; the in-process app itself is `elastrain.testing.app`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from elastrain.server.access_log import LOGGER_NAME
from elastrain.testing.app import AppUnderTest, make_app

__all__ = ["AppUnderTest", "Lines", "access_lines", "make_app"]


class Lines(logging.Handler):
    """Collects formatted records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def access_lines() -> Iterator[list[str]]:
    """The access-log lines logged while the block runs."""
    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
