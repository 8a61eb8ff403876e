"""Logging setup for the command-line entry points (dodo.py, ``python -m mnnbuild``)."""

from __future__ import annotations

import logging
import os

LOG_LEVEL_ENV = "MNNBUILD_LOG_LEVEL"


def configure_logging(level: str | None = None) -> None:
    """Send mnnbuild's log records to stderr at ``level`` (default from ``MNNBUILD_LOG_LEVEL`` or INFO)."""
    name = (level or os.environ.get(LOG_LEVEL_ENV, "INFO")).upper()
    logger = logging.getLogger("mnnbuild")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname).1s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(name)
    # QNN's own INFO lines are many per graph; show them only when debugging
    logging.getLogger("mnnbuild.qnn.lib").setLevel(name if name == "DEBUG" else max(logging.WARNING, logger.level))
