"""What a Dask worker runs for one task: the task in a child process (`mnnbuild.cluster.child`), killed when the
client cancels the task (Ctrl-C: a Dask worker cannot stop the thread running a task, it can stop a process)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from mnnbuild.cluster.child import PRELOAD

POLL_SECONDS = 0.1
STOPPED = ("cancelled", "released", "forgotten")
"""Worker task states of a task nobody wants any more."""


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


def run_task(payload: bytes) -> dict[str, Any]:
    """Run the pickled `mnnbuild.cluster.task.RemoteTask` ``payload`` in a child process; its result, or
    ``{"error": line}``."""
    from distributed import get_worker

    from mnnbuild.cluster.child import run

    worker = get_worker()
    key = worker.get_current_task()
    ctx = _forkserver()
    with tempfile.TemporaryDirectory(prefix="mnnbuild-submit-") as tmp:
        task_file, result_file = Path(tmp, "task.pkl"), Path(tmp, "result.json")
        task_file.write_bytes(payload)
        child = ctx.Process(target=run, args=(str(task_file), str(result_file), worker.address))
        child.start()
        try:
            while child.is_alive():
                state = worker.state.tasks.get(key)
                if state is None or state.state in STOPPED:
                    child.kill()
                    child.join()
                    return {"error": f"worker {worker.address}: cancelled"}
                time.sleep(POLL_SECONDS)
        finally:
            if child.is_alive():
                child.kill()
                child.join()
        if result_file.is_file():
            return dict(json.loads(result_file.read_text(encoding="utf-8")))
        return {"error": f"worker {worker.address}: the task's process ended with {child.exitcode} before its result"}
