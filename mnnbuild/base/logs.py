"""Logging setup for the command-line entry points (dodo.py, ``python -m mnnbuild``)."""

from __future__ import annotations

import logging
import os

from mnnbuild.base.errors import SettingsError

LOG_LEVEL_ENV = "MNNBUILD_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(level: str | None = None) -> str:
    """The level to log at: ``level``, else ``MNNBUILD_LOG_LEVEL``, else INFO; one of :data:`LOG_LEVELS`, any case."""
    raw = level if level is not None else os.environ.get(LOG_LEVEL_ENV, "INFO")
    name = raw.strip().upper()
    if name not in LOG_LEVELS:
        where = "log level" if level is not None else LOG_LEVEL_ENV
        raise SettingsError(f"{where}={raw!r}: expected one of {', '.join(LOG_LEVELS)} (any case)")
    return name


def configure_logging(level: str | None = None) -> None:
    """Send mnnbuild's log records to stderr at ``level`` (default from ``MNNBUILD_LOG_LEVEL`` or INFO); a value
    that is no level raises :class:`~mnnbuild.base.errors.SettingsError` before anything is configured."""
    name = log_level(level)
    logger = logging.getLogger("mnnbuild")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname).1s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(name)
    # QNN's own INFO lines are many per graph; show them only when debugging
    logging.getLogger("mnnbuild.qnn.lib").setLevel(name if name == "DEBUG" else max(logging.WARNING, logger.level))
