"""How a doit run ends when it is stopped from outside.

- SIGTERM (what a CI cancel or ``kill`` sends) is handled as Ctrl-C: it raises KeyboardInterrupt, so the same
  cleanup runs (a stage's temp dir is removed, doit saves the state of the tasks that finished) and the run
  exits non-zero.
- Either ends in one line saying so (`interrupted`), not KeyboardInterrupt's traceback through doit.
- The worker processes of ``doit -n N`` die with the process that forked them: a killed parent (``kill -9``)
  leaves no worker waiting forever for its next task. Linux only (``PR_SET_PDEATHSIG``); elsewhere nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def handle_interrupts() -> None:
    """Install both behaviours in this (doit's main) process; what it forks later inherits them."""
    try:
        signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread (doit driven from a thread): leave signals to the caller
        return
    sys.excepthook = _one_line(sys.excepthook)
    if sys.platform.startswith("linux"):
        forking = [os.getpid()]

        def before() -> None:
            forking[0] = os.getpid()

        os.register_at_fork(before=before, after_in_child=lambda: _die_with_parent(forking[0]))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def interrupted(exc: KeyboardInterrupt) -> str:
    """The line a stopped run ends with."""
    how = str(exc) or "stopped by Ctrl-C"
    return f"{how}: the tasks that finished are kept, an unfinished one left nothing; run the same command to resume"


def _one_line(previous: Callable[..., Any]) -> Callable[..., Any]:
    """An excepthook that ends a stopped run with `interrupted`'s line (the exit status stays an interrupt's) and
    leaves every other exception to ``previous``."""

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, KeyboardInterrupt):
            sys.stderr.write(interrupted(exc) + "\n")
        else:
            previous(kind, exc, tb)

    return hook


def _die_with_parent(parent: int) -> None:
    """In a freshly forked child: get SIGTERM (handled as above) when the parent dies, or now if it already did."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died between fork and prctl
        os.kill(os.getpid(), signal.SIGTERM)
