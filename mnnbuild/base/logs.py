"""Logging setup for the command-line entry points (dodo.py, ``python -m mnnbuild``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, TypeVar

from mnnbuild.base.errors import SettingsError
from mnnbuild.base.native import CurrentStderr

T = TypeVar("T")

LOG_LEVEL_ENV = "MNNBUILD_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(level: str | None = None, default: str = "INFO") -> str:
    """The level to log at: ``level``, else ``MNNBUILD_LOG_LEVEL``, else ``default``; one of :data:`LOG_LEVELS`, any
    case."""
    raw = level if level is not None else os.environ.get(LOG_LEVEL_ENV, default)
    name = raw.strip().upper()
    if name not in LOG_LEVELS:
        where = "log level" if level is not None else LOG_LEVEL_ENV
        raise SettingsError(f"{where}={raw!r}: expected one of {', '.join(LOG_LEVELS)} (any case)")
    return name


def configure_logging(level: str | None = None, default: str = "INFO") -> None:
    """Send mnnbuild's log records to stderr at ``level`` (default from ``MNNBUILD_LOG_LEVEL``, else ``default``); a
    value that is no level raises :class:`~mnnbuild.base.errors.SettingsError` before anything is configured."""
    name = log_level(level, default)
    logger = logging.getLogger("mnnbuild")
    if not logger.handlers:
        handler = logging.StreamHandler(CurrentStderr())  # the terminal also while native output is captured
        handler.setFormatter(logging.Formatter("%(levelname).1s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(name)
    # QNN's own INFO lines are many per graph; show them only when debugging
    logging.getLogger("mnnbuild.qnn.lib").setLevel(name if name == "DEBUG" else max(logging.WARNING, logger.level))


def progress(items: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "it") -> Any:
    """A tqdm bar over ``items`` (or one to ``update`` by hand) for work that runs long at real size: on a terminal
    only, and not when mnnbuild logs below INFO (``-q``); it disappears when done (the task's line stays)."""
    from tqdm import tqdm  # here, not at the top: a doit start that runs nothing long never loads it

    quiet = not logging.getLogger("mnnbuild").isEnabledFor(logging.INFO)
    return tqdm(
        items, desc=desc, total=total, unit=unit, leave=False, disable=True if quiet else None, file=CurrentStderr()
    )
