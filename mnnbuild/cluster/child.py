"""The process a worker runs its tasks in (`mnnbuild.cluster.worker`), one at a time: forked from a server that
imported mnnbuild's stages once, and kept for the next task, as a local doit process is (a fresh interpreter per task
spent 1.5 s importing and hashing sources on a loaded 2-core box, and the context stage's own compose server started
again for each). It watches the worker and ends with it, with what it started: a killed worker leaves no task
running."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import pickle
import select
import signal
import sys
import threading
import time
from typing import Any

from mnnbuild.cluster.task import execute

_PR_SET_PDEATHSIG = 1
PRELOAD = ["mnnbuild.cluster.task", "mnnbuild.stages.chain"]
"""What the fork server imports before forking task processes: every stage module (by name: what the worker runs is
named by the client's task)."""


def kill_tree(pid: int) -> None:
    """SIGKILL to every process under ``pid`` (the context stage's compose server and its children)."""
    import psutil  # distributed's dependency: there on every worker

    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for proc in below:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _watch(worker_pid: int) -> None:
    """Until the worker dies; then end this process and everything it started (a fork server's child cannot die with
    the worker by PDEATHSIG: its parent is the fork server, which lives while it does)."""
    try:
        fd = os.pidfd_open(worker_pid)
        select.select([fd], [], [])
    except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): poll
        while True:
            try:
                os.kill(worker_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    kill_tree(os.getpid())
    os._exit(1)


@functools.cache
def _watched(worker_pid: int) -> None:
    if sys.platform.startswith("linux"):  # and with the fork server, should the worker's watch fail
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    threading.Thread(target=_watch, args=(worker_pid,), daemon=True, name="worker-watch").start()


def run(payload: bytes, worker: str, worker_pid: int) -> dict[str, Any]:
    """One task: the pickled `RemoteTask` ``payload``; its result (`execute`). ``worker_pid``: the Dask worker's
    process, which this one dies with."""
    _watched(worker_pid)
    logging.basicConfig(level=os.environ.get("MNNBUILD_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    return execute(pickle.loads(payload), worker)
