"""The process a worker runs one task in (`mnnbuild.cluster.worker`), forked from a server that imported mnnbuild's
stages once (a fresh interpreter per task spent 1.5 s importing and hashing sources on a loaded 2-core box). It dies
with that server, which ends with the worker: a killed worker leaves no task running. Its result is written whole."""

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
PRELOAD = ["mnnbuild.cluster.task", "mnnbuild.stages.chain"]
"""What the fork server imports before forking tasks: every stage module (by name: what the worker runs is named by
the client's task)."""


def _die_with_parent() -> None:
    """SIGKILL when the process that forked us dies (Linux), or now if it already did."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def run(task_file: str, result_file: str, worker: str) -> None:
    """One task: the pickled `RemoteTask` in ``task_file``, its result (`execute`) written to ``result_file``."""
    _die_with_parent()
    logging.basicConfig(level=os.environ.get("MNNBUILD_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    task = pickle.loads(Path(task_file).read_bytes())
    result = execute(task, worker)
    atomic_write_text(Path(result_file), json.dumps(result))
