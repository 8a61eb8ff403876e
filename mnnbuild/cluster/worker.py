"""What a Dask worker runs for one task: the task in a child process (`mnnbuild.cluster.child`), killed when the
client cancels the task (Ctrl-C: a Dask worker cannot stop the thread running a task, it can stop a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.2
STOPPED = ("cancelled", "released", "forgotten")
"""Worker task states of a task nobody wants any more."""


def run_task(payload: bytes) -> dict[str, Any]:
    """Run the pickled `mnnbuild.cluster.task.RemoteTask` ``payload`` in a child process; its result, or
    ``{"error": line}``."""
    from distributed import get_worker

    worker = get_worker()
    key = worker.get_current_task()
    with tempfile.TemporaryDirectory(prefix="mnnbuild-submit-") as tmp:
        task_file, result_file, log_file = Path(tmp, "task.pkl"), Path(tmp, "result.json"), Path(tmp, "stderr.txt")
        task_file.write_bytes(payload)
        with log_file.open("wb") as err:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mnnbuild.cluster.child",
                    str(task_file),
                    str(result_file),
                    str(os.getpid()),
                    worker.address,
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
            )
            try:
                while child.poll() is None:
                    state = worker.state.tasks.get(key)
                    if state is None or state.state in STOPPED:
                        child.kill()
                        child.wait()
                        return {"error": f"worker {worker.address}: cancelled"}
                    time.sleep(POLL_SECONDS)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if result_file.is_file():
            return dict(json.loads(result_file.read_text(encoding="utf-8")))
        said = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        last = said[-1] if said else "nothing said"
        return {"error": f"worker {worker.address}: the task's process ended with {child.returncode}: {last}"}
