"""What a user sees of a build: native banners only when asked for, a line per task, an ending that says where the
result is and what to do next, and `status` saying why a task would run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL_DIR, RunDoit, copy_project

BANNERS = ("The device supports", "MNN use high precision", "LIBNATIVE")
"""What PyPI MNN and Qualcomm's HTP library print straight to fds 1 and 2."""

NATIVE_SCRIPT = """
import sys
from pathlib import Path
from mnnbuild.base.logs import configure_logging
configure_logging(sys.argv[1])
from mnnbuild.cpu import CpuRuntime, load_module
from mnnbuild.qnn import QnnLibrary
load_module(Path(sys.argv[2]), CpuRuntime().create())
QnnLibrary()
print("done")
"""


def run_native(level: str) -> str:
    model = Path(__file__).resolve().parent.parent / "models" / "tiny-qwen3" / "llm.mnn"
    proc = subprocess.run(
        [sys.executable, "-c", NATIVE_SCRIPT, level, str(model)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("done"), proc.stdout  # Python's own output is untouched
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_native_banners_appear_at_debug_only() -> None:
    quiet = run_native("INFO")
    assert not [b for b in BANNERS if b in quiet], quiet
    loud = run_native("DEBUG")
    assert all(b in loud for b in BANNERS), loud
    assert "D mnnbuild.base.native: MNN (runtime manager) printed:" in loud, loud


FAILING_SCRIPT = """
import logging, os
from mnnbuild.base.logs import configure_logging
from mnnbuild.base.native import native_output
configure_logging("WARNING")
log = logging.getLogger("mnnbuild.test")
with native_output("quiet call"):
    os.write(1, b"banner of a call that worked\\n")
    log.warning("a warning meanwhile")
try:
    with native_output("failing call"):
        os.write(2, b"why the native call failed\\n")
        raise RuntimeError("failed")
except RuntimeError:
    pass
"""


def test_native_output_of_a_failed_call_is_shown_and_python_output_is_not_captured() -> None:
    proc = subprocess.run([sys.executable, "-c", FAILING_SCRIPT], capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "banner of a call that worked" not in out, out
    assert "W mnnbuild.test: a warning meanwhile" in proc.stderr, out  # reached the terminal during the capture
    assert "E mnnbuild.base.native: failing call printed:\nwhy the native call failed" in proc.stderr, out


# -- a whole build, then status ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A clone of the project and the output of its first bare `doit` (artifacts inside it, the default)."""
    clone = copy_project(tmp_path_factory.mktemp("console") / "clone")
    proc = subprocess.run(
        [sys.executable, "-m", "doit"], cwd=clone, env=clean_env(), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return clone, proc


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update({"HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off", **extra})
    return env


@pytest.mark.slow
def test_a_first_build_is_a_line_per_task_and_an_ending(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, proc = project
    tasks = [line for line in proc.stdout.splitlines() if line.startswith(".  ")]
    rest = [line for line in proc.stdout.splitlines() if not line.startswith(".  ")]
    assert len(tasks) >= 10 and not proc.stderr.strip(), proc.stderr  # no log lines, no banners
    assert not [b for b in BANNERS if b in proc.stdout], proc.stdout
    assert rest[0].startswith("done in ") and f"{len(tasks)} built, 0 up to date" in rest[0], rest
    assert rest[1].startswith("partition tiny-qwen3: ") and "the CPU keeps 0.0% of the weights" in rest[1], rest
    bundle = Path("artifacts/tiny-qwen3/v79/bundle")
    assert rest[2].startswith(f"bundle  {bundle} (12 files, "), rest
    assert rest[3] == f"report  {(clone / 'artifacts/tiny-qwen3/v79/report/index.html').as_uri()}", rest
    assert rest[4].startswith("push    ") and rest[4].endswith(str(bundle / "push.sh")), rest
    assert len(proc.stdout.splitlines()) <= 22, proc.stdout


def status(clone: Path, *tasks: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "status", *tasks],
        cwd=clone,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stdout + proc.stderr
    return proc.stdout


def reasons(out: str) -> dict[str, list[str]]:
    """Task -> its reason lines, from `status`'s output."""
    found: dict[str, list[str]] = {}
    task = ""
    for line in out.splitlines():
        if line.startswith("    "):
            found[task].append(line.strip())
        elif ":" in line and " " not in line:
            task = line
            found[task] = []
    return found


def edited(path: Path, old: str, new: str) -> Callable[[], None]:
    """Replace ``old`` by ``new`` in ``path``; returns what undoes it."""
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
    return lambda: path.write_text(text)


@pytest.mark.slow
def test_status_after_a_build_says_nothing_would_run(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, _ = project
    out = status(clone)
    assert out.strip().startswith("up to date:") and "nothing would run" in out, out
    listed = subprocess.run(
        [sys.executable, "-m", "doit", "list", "--status", "--all"], cwd=clone, env=clean_env(), capture_output=True,
        text=True, timeout=300,
    ).stdout  # fmt: skip
    rows = {line.split()[1]: line for line in listed.splitlines() if line.strip()}
    for group in ("context:tiny-qwen3-v79", "twin:tiny-qwen3-v79", "verify"):  # groups of built tasks
        assert rows[group].startswith("U "), rows[group]
    assert "created after its partition" not in rows["context:tiny-qwen3-v79"], rows["context:tiny-qwen3-v79"]


@pytest.mark.slow
def test_status_names_a_changed_input_file(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, _ = project
    undo = edited(clone / "models/tiny-qwen3/config.json", "{", '{"comment": "edited",')
    try:
        found = reasons(status(clone, "io:tiny-qwen3"))
    finally:
        undo()
    # first the cause; fetch's outputs link to the model's files, so its link reads the edited file too
    assert found["fetch:tiny-qwen3"][0] == "input changed: models/tiny-qwen3/config.json", found
    assert list(found) == ["fetch:tiny-qwen3"], found  # io only if fetch's outputs come out different


@pytest.mark.slow
def test_status_names_a_changed_param(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, _ = project
    undo = edited(clone / "models/tiny-qwen3.toml", "chunk_size = 128", "chunk_size = 128\nseed = 7")
    try:
        found = reasons(status(clone, "io:tiny-qwen3"))
    finally:
        undo()
    assert found == {"io:tiny-qwen3": ["param seed: 0 -> 7"]}, found


@pytest.mark.slow
def test_status_names_changed_code(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, _ = project
    module = clone / "mnnbuild/stages/config.py"
    undo = edited(module, "\nlog = logging.getLogger(__name__)\n", "\nlog = logging.getLogger(__name__)\nEDITED = 1\n")
    try:
        found = reasons(status(clone, "config:tiny-qwen3-v79"))
    finally:
        undo()
    assert found == {"config:tiny-qwen3-v79": ["code changed: mnnbuild.stages.config"]}, found


@pytest.mark.slow
def test_status_names_a_missing_output(project: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    clone, _ = project
    output = clone / "artifacts/tiny-qwen3/io/testdir/1/output.mnn"
    kept = output.read_bytes()
    output.unlink()
    try:
        found = reasons(status(clone, "io:tiny-qwen3"))
    finally:
        output.write_bytes(kept)
    assert found == {"io:tiny-qwen3": ["output missing: artifacts/tiny-qwen3/io/testdir/1/output.mnn"]}, found


@pytest.mark.slow
def test_a_failed_build_ends_with_the_task_its_reason_and_the_file_to_read(tmp_path: Path, run_doit: RunDoit) -> None:
    src, specs = tmp_path / "src", tmp_path / "specs"
    shutil.copytree(TINY_MODEL_DIR, src)
    specs.mkdir()
    (specs / "broken.toml").write_text(f'name = "broken"\nsource = {{ local = "{src}" }}\ntargets = ["v79"]\n')
    config = src / "llm_config.json"
    config.write_text(config.read_text().replace('"hidden_size": 128', '"hidden_size": 64'))
    proc = run_doit("io:broken", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    ending = proc.stdout.splitlines()[1:]  # after `.  fetch:broken`
    assert ending[0].startswith("failed in ") and ending[0].endswith("0 built, 0 up to date, 1 failed"), ending
    assert ending[1] == "failed  fetch:broken:", ending
    assert ending[2].startswith(f"ModelDirError: {config}: field 'hidden_size' is 64"), ending
    assert ending[3] == f"read    {config}", ending
    assert len(ending) == 5, ending
