"""The process a worker runs one task in (`mnnbuild.cluster.worker`): ``python -m mnnbuild.cluster.child TASK RESULT
PARENT WORKER``. It dies with the worker (a killed worker leaves no task running), and writes its result whole."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pickle
import signal
import sys
from pathlib import Path

from mnnbuild.base.fsutil import atomic_write_text
from mnnbuild.cluster.task import execute

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL when the worker that started us dies (Linux), or now if it already did."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str]) -> int:
    task_file, result_file, parent, worker = argv
    _die_with(int(parent))
    logging.basicConfig(level=os.environ.get("MNNBUILD_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    task = pickle.loads(Path(task_file).read_bytes())
    result = execute(task, worker)
    atomic_write_text(Path(result_file), json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
