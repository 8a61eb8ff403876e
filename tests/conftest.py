"""Shared test fixtures: the shipped tiny model, fixture models, and running doit like a user."""

from __future__ import annotations

import compileall
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from mnnbuild.dag.reporter import LAST_RUN

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_DIR = PROJECT_ROOT / "models" / "tiny-qwen3"
FIXTURE_MODELS = PROJECT_ROOT / "tests" / "fixtures" / "models"

RunDoit = Callable[..., subprocess.CompletedProcess[str]]

MODULE_SECONDS: dict[str, float] = json.loads((Path(__file__).parent / "module_seconds.json").read_text())
"""Seconds each test module took in a whole run (`python -m tests.module_seconds JUNIT_XML` rewrites it)."""


USER_CACHE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C delivered as a user's terminal delivers it. A shell that starts the run in the background (``cmd &``,
    ``nohup``) leaves SIGINT ignored, and an ignored signal stays ignored across exec: Python then installs no
    KeyboardInterrupt handler in this process, the xdist workers or any doit the tests start, and the tests of
    Ctrl-C fail for the launcher's reason. A handled signal is reset to the default on exec, so this reaches them
    all."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _pin_worker(config)
    if not hasattr(config, "workerinput"):
        # one user cache dir for the whole run (the xdist workers and every process they start inherit it): the
        # builds share mnnbuild's code-digest memo there, and no test reads or fills the user's own ~/.cache
        config.stash[USER_CACHE] = Path(tempfile.mkdtemp(prefix="mnnbuild-tests-cache-"))
        os.environ["XDG_CACHE_HOME"] = str(config.stash[USER_CACHE])


def _pin_worker(config: pytest.Config) -> None:
    """An xdist worker (and everything it starts: doit, its children, MNN's and QNN's threads) runs on its own share
    of the CPUs. MNN sizes its thread pool by the CPUs a process may use (`mnnbuild.cpu.usable_cpus`), and its
    threads wait for each other at every op: with a worker per core, unpinned, each worker's MNN ran two threads on
    cores the other worker kept busy (the Eagle pair's CPU loop beside one busy core: 29.7 s unpinned, 14.4 s on a
    core of its own). MNN's values do not depend on its thread count (`tests/test_segments.py`); numpy's BLAS sums
    in an order that follows its threads, so a module's builds and its tests share one worker's CPUs and compare
    equal (docs/benchmarks.md, "Round five")."""
    info = getattr(config, "workerinput", None)
    if info is None or not hasattr(os, "sched_setaffinity"):
        return
    cpus, workers = sorted(os.sched_getaffinity(0)), int(info["workercount"])
    worker = int(str(info["workerid"]).removeprefix("gw"))
    os.sched_setaffinity(0, cpus[worker % workers :: workers] or [cpus[worker % len(cpus)]])


def pytest_unconfigure(config: pytest.Config) -> None:
    if USER_CACHE in config.stash:
        shutil.rmtree(config.stash[USER_CACHE], ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first. With ``--dist loadfile`` a module runs whole on one worker, handed out in the
    order of the collection (``--no-loadscope-reorder``: xdist's own order is by number of tests, which left the
    few-test modules that build a bundle for the end, one worker busy for minutes while the other had nothing left).
    Longest first, the short ones fill in at the end and the workers finish together; a module not in the table
    counts as the median one. Only the order changes: every test runs, in its module's order."""
    known = sorted(MODULE_SECONDS.values())
    default = known[len(known) // 2] if known else 0.0

    def weight(item: pytest.Item) -> tuple[float, str]:
        module = item.nodeid.split("::", 1)[0]
        return -MODULE_SECONDS.get(Path(module).stem, default), module

    items.sort(key=weight)  # stable: a module's tests keep their order


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the project once: with ``PYTHONDONTWRITEBYTECODE`` set (this box sets it) every doit, io and
    verify process the tests start would compile mnnbuild and the runtime again (0.3-0.8 s of CPU each)."""
    if not hasattr(session.config, "workerinput"):  # the controller, before the xdist workers start
        for code in (PROJECT_ROOT / "mnnbuild", PROJECT_ROOT / "runtime", PROJECT_ROOT / "dodo.py"):
            if code.is_dir():
                compileall.compile_dir(code, quiet=1)
            else:
                compileall.compile_file(code, quiet=1)


@pytest.fixture
def tiny_model_dir() -> Path:
    return TINY_MODEL_DIR


@pytest.fixture
def run_doit(tmp_path: Path) -> RunDoit:
    """Run ``doit`` on the project's dodo.py from an unrelated directory, artifacts under tmp_path: `doit` in it.

    Keywords: ``env`` adds environment variables; ``check`` (default True) asserts success;
    ``project`` runs another copy of the project (its own dodo.py and mnnbuild package).
    """
    return functools.partial(doit, tmp_path, check=True, timeout=600)


def executed_tasks(output: str) -> list[str]:
    """Tasks doit ran (lines ``.  name``), as opposed to up-to-date ones (``-- name``)."""
    return [line[3:].strip() for line in output.splitlines() if line.startswith(".  ")]


def skipped_tasks(output: str) -> list[str]:
    return [line[3:].strip() for line in output.splitlines() if line.startswith("-- ")]


def copy_project(dest: Path) -> Path:
    """A copy of the project's sources, as a fresh clone elsewhere would have them (no artifacts). Their bytecode
    comes along (`pytest_sessionstart` compiled it; the copies keep the sources' mtimes, which it records): with
    ``PYTHONDONTWRITEBYTECODE`` every doit in the copy would compile mnnbuild again, and a source a test edits is
    compiled anew as usual (its mtime is no longer the one recorded)."""
    ignore = shutil.ignore_patterns(".git", ".venv", "venv", "artifacts", "*.egg-info", ".*cache")
    shutil.copytree(PROJECT_ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def doit(
    cwd: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    project: Path = PROJECT_ROOT,
    check: bool = False,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``doit`` on the project's dodo.py (or ``project``'s) run in ``cwd``, with artifacts under ``cwd/artifacts``
    and the cache off (``env`` may say otherwise); ``check``: assert it succeeded. Module-wide fixtures call it,
    which cannot use a per-test tmp_path (`run_doit`)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    # the cache is off unless a test turns it on, so no test reads or fills ~/.cache
    full_env.update({"MNNBUILD_ARTIFACTS": str(cwd / "artifacts"), "HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off"})
    full_env.update(env or {})
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(project / "dodo.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    attach_record(proc, Path(full_env["MNNBUILD_ARTIFACTS"]), started)
    if check:
        assert proc.returncode == 0, f"doit {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def attach_record(
    proc: subprocess.CompletedProcess[str], artifacts: Path, started: float
) -> subprocess.CompletedProcess[str]:
    """``proc`` with ``proc.record``: what that doit run did by its ``.doit-run.json`` under ``artifacts`` (the task
    lists the terminal no longer gets), or None when the run wrote none (it stopped before its end)."""
    path = artifacts / LAST_RUN
    fresh = path.is_file() and path.stat().st_mtime >= started - 1
    proc.record = json.loads(path.read_text(encoding="utf-8")) if fresh else None  # type: ignore[attr-defined]
    return proc
