"""What a Dask worker runs for one task: the task in a process of its own (`mnnbuild.cluster.child`), one per worker
thread and kept for the next task, killed when the client cancels the task (Ctrl-C: a Dask worker cannot stop the
thread running a task, it can stop a process)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from mnnbuild.cluster.child import PRELOAD, kill_tree

POLL_SECONDS = 0.1
STOPPED = ("cancelled", "released", "forgotten")
"""Worker task states of a task nobody wants any more."""

_RUNNERS: dict[int, ProcessPoolExecutor] = {}
"""Each worker thread's task process."""


@functools.cache
def _forkserver() -> Any:
    """The fork server of this worker (it exits when the worker does), with mnnbuild's stages imported."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def dask_setup(worker: Any) -> None:
    """``dask worker --preload mnnbuild.cluster.worker``: start the fork server (importing the stages, ~1-4 s) as the
    worker starts, not with its first task."""
    _forkserver()
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _runner() -> ProcessPoolExecutor:
    thread = threading.get_ident()
    if thread not in _RUNNERS:
        _RUNNERS[thread] = ProcessPoolExecutor(max_workers=1, mp_context=_forkserver())
    return _RUNNERS[thread]


def _kill_runner() -> None:
    """Kill this thread's task process (and what it started: it dies with its parent); the next task gets a new one."""
    pool = _RUNNERS.pop(threading.get_ident(), None)
    if pool is None:
        return
    for proc in list(getattr(pool, "_processes", {}).values()):
        if proc.pid is not None:
            kill_tree(proc.pid)
        proc.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def run_task(payload: bytes) -> dict[str, Any]:
    """Run the pickled `mnnbuild.cluster.task.RemoteTask` ``payload`` in this thread's task process; its result, or
    ``{"error": line}``."""
    from distributed import get_worker

    from mnnbuild.cluster.child import run

    worker = get_worker()
    key = worker.get_current_task()
    future = _runner().submit(run, payload, worker.address, os.getpid())
    while not future.done():
        state = worker.state.tasks.get(key)
        if state is None or state.state in STOPPED:
            _kill_runner()
            return {"error": f"worker {worker.address}: cancelled"}
        time.sleep(POLL_SECONDS)
    try:
        return dict(future.result())
    except BrokenProcessPool:
        _kill_runner()
        return {"error": f"worker {worker.address}: the task's process died"}
