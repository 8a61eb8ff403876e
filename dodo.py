"""mnnbuild's task DAG: `doit list` shows the tasks, `doit bundle:<model>-<arch>` builds one.

This file only declares tasks: one group per stage of the chain (`mnnbuild.stages.chain.STAGES`), each task derived
from its stage's declaration; the stages live in `mnnbuild/stages/`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mnnbuild import dag
from mnnbuild.stages.chain import CHAIN

dag.configure_logging()  # MNNBUILD_LOG_LEVEL: a value that is no level is one line
dag.handle_interrupts()  # SIGTERM cleans up like Ctrl-C; `doit -n` workers die with their parent
dag.skip_final_collection()  # the OS frees this process's objects at exit, not a last collection over them
PROJECT = dag.Project.load(Path(__file__).resolve().parent, CHAIN, sys.argv[1:])  # named tasks: their files
DOIT_CONFIG = PROJECT.doit_config()

# task_<stage> per stage, task_update, and task_npu_<model>: the context, twin, bundle, verify and report tasks of a
# model, created once its partition has said how many plugins it has
globals().update(dag.task_creators(PROJECT, sys.argv[1:]))
