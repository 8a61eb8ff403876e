"""What a stage run cost the machine, and which doit run it belonged to (for origin records)."""

from __future__ import annotations

import multiprocessing
import os
import resource
from pathlib import Path

from mnnbuild.base.fsutil import process_start

_PROC = Path("/proc")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``), so the next reading covers what runs from now on."""
    try:
        (_PROC / "self" / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss() -> int:
    """This process's peak resident set size in bytes since the last reset (or since it started)."""
    try:
        for line in (_PROC / "self" / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_id() -> str:
    """Identifies one doit invocation: its process id and start time, the same in its worker processes (-n)."""
    parent = multiprocessing.parent_process()
    pid = parent.pid if parent is not None and parent.pid is not None else os.getpid()
    started = process_start(pid)
    return f"{pid}:{started[0] if started else '?'}"
