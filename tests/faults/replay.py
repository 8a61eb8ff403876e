"""Fault replay: the cases of issues 27 and 43 ("Trust", rounds 2 and 3), run as a user would, and what they see.

Each case is a small function registered with ``@case``: it sets up a temp project, artifact root or cache, does
the bad thing a hostile but fair user (or the OOM killer) would, and returns an `Outcome`: whether the guarantee
held, the exit code, the last lines the user saw, and whether files outside what mnnbuild owns were touched. The
tests in ``tests/test_faults_fs.py`` (files and processes) and ``tests/test_input_faults.py``, ``test_spec.py``,
``test_fetch.py``, ``test_io.py``, ``test_runtime.py``, ``test_mnn_cli.py``, ``test_conform.py`` (inputs, messages,
conform) assert the same cases; this replay shows them side by side, for a person reading what a user sees: it
asserts nothing itself and no test or CI runs it (the tests are the check; a case that did not hold exits 1).
``conform-renamed-model`` runs conform whole and needs ``MNN_SOURCE`` and QNN headers (``FAULTS_QNN_HEADERS``, a
dir holding QnnInterface.h, or ``QNN_SDK_ROOT``); the MNN build is reused from ``MNNBUILD_CONFORM_CACHE``. Without
them its row says "not run".

    python -m tests.faults.replay                 # every case -> table + tests/faults/replayed.json
    python -m tests.faults.replay --only prune    # the cases whose name contains 'prune'
    python -m tests.faults.replay --list

To add cases, write a function ``(work: Path, shared: Shared) -> Outcome`` decorated with
``@case("name", "issue 27's item", "the bad thing")``; ``work`` is a fresh temp dir, ``shared`` lazily builds things
several cases need (a tiny bundle) once per run. Cases run in the order they are registered.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR, attach_record, copy_project
from tests.test_cache import summary
from tests.test_faults_fs import (
    aged,
    composing,
    link_out,
    marked_processes,
    restore_bad_blob_read_only,
    small_cache,
    tree_state,
    user_files,
)

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))  # the scripts' table printer and run record
from _common import checkout_commit, machine, print_table  # noqa: E402

RECORD = Path(__file__).resolve().parent / "replayed.json"
"""What the last replay saw, case by case (with the commit it ran)."""


@dataclass
class Outcome:
    held: bool
    """Whether the guarantee held (nothing outside touched, one clear line, no process left, ...)."""
    exit: int | None
    saw: str
    """The last lines the user saw (stderr, else stdout), or what the case observed."""
    outside_touched: bool | None = None
    """Whether files mnnbuild does not own changed (None: not what the case is about)."""


@dataclass
class Case:
    name: str
    item: str
    bad_thing: str
    run: Callable[[Path, Shared], Outcome]


CASES: list[Case] = []


def case(name: str, item: str, bad_thing: str) -> Callable[[Callable[[Path, Shared], Outcome]], Callable]:
    def register(fn: Callable[[Path, Shared], Outcome]) -> Callable[[Path, Shared], Outcome]:
        CASES.append(Case(name, item, bad_thing, fn))
        return fn

    return register


@dataclass
class Shared:
    """What several cases need, made once per run on first use."""

    root: Path
    _bundle: Path | None = field(default=None, repr=False)

    def bundle_root(self) -> Path:
        """An artifact root holding the tiny bundle and verify's twins (cases copy it before damaging it)."""
        if self._bundle is None:
            self._bundle = self.root / "built" / "artifacts"
            proc = doit(self._bundle, "bundle:tiny-qwen3-v79", "twin:tiny-qwen3-v79")
            if proc.returncode != 0:
                raise RuntimeError(f"building the tiny bundle failed:\n{proc.stdout}\n{proc.stderr}")
        return self._bundle

    def bundle_copy(self, dest: Path) -> Path:
        shutil.copytree(self.bundle_root(), dest, symlinks=True)
        return dest


# -- running things the way a user does --------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update({"HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off", "MNNBUILD_LOG_LEVEL": "WARNING"})
    env.update(extra)
    return env


NEUTRAL_CWD: Path | None = None
"""An empty directory of this run's for commands without an artifact root to run beside: ``python -m doit`` puts its
cwd on sys.path, so a shared /tmp holding someone's ``numbers.py`` would break the run, not the case."""


def doit(root: Path | None, *args: str, project: Path = PROJECT_ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``doit <args>`` on ``project``'s dodo.py into the artifact root ``root`` (None: whatever ``env`` says)."""
    if root is not None:
        env = {"MNNBUILD_ARTIFACTS": str(root), **env}
    cwd = root.parent if root is not None else NEUTRAL_CWD or Path(tempfile.gettempdir())
    cwd.mkdir(parents=True, exist_ok=True)
    full_env, started = clean_env(**env), time.time()
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(project / "dodo.py"), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    return attach_record(proc, Path(full_env.get("MNNBUILD_ARTIFACTS", project / "artifacts")), started)


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mnnbuild", *args], cwd=cwd or PROJECT_ROOT, env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def last_lines(proc: subprocess.CompletedProcess[str], n: int = 1, needle: str | None = None) -> str:
    """The last ``n`` lines the user saw (stderr, else stdout), or the first line holding ``needle``."""
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    if needle is not None:
        text = [line for line in (proc.stdout + proc.stderr).splitlines() if needle in line][:1] or text
    return " | ".join(line.strip() for line in text[-n:])


def one_line(proc: subprocess.CompletedProcess[str]) -> bool:
    out = proc.stdout + proc.stderr
    return "Traceback" not in out and len(proc.stderr.strip().splitlines()) <= 2


# -- item 1: roots checked before anything is written ----------------------------------------------------------------


@case("empty-artifact-root", "1", "MNNBUILD_ARTIFACTS= and a spec named mnnbuild; doit partition:mnnbuild")
def empty_artifact_root(work: Path, shared: Shared) -> Outcome:
    project = copy_project(work / "clone")
    (project / "models" / "mnnbuild.toml").write_text(
        f'name = "mnnbuild"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n'
    )
    before = tree_state(project / "mnnbuild")
    proc = doit(None, "partition:mnnbuild", project=project, MNNBUILD_ARTIFACTS="")
    touched = tree_state(project / "mnnbuild") != before
    return Outcome(not touched and proc.returncode != 0 and one_line(proc), proc.returncode, last_lines(proc), touched)


@case("artifact-root-in-package", "1", "MNNBUILD_ARTIFACTS=<project>/mnnbuild; doit list")
def artifact_root_in_package(work: Path, shared: Shared) -> Outcome:
    project = copy_project(work / "clone")
    before = tree_state(project / "mnnbuild")
    proc = doit(None, "list", project=project, MNNBUILD_ARTIFACTS=str(project / "mnnbuild"))
    touched = tree_state(project / "mnnbuild") != before
    return Outcome(not touched and proc.returncode != 0 and one_line(proc), proc.returncode, last_lines(proc), touched)


@case("root-holds-a-model-dir", "1", "MNNBUILD_ARTIFACTS= the parent of a local model's dir")
def root_holds_model_dir(work: Path, shared: Shared) -> Outcome:
    shutil.copytree(TINY_MODEL_DIR, work / "models" / "mine")
    (work / "specs").mkdir()
    spec = f'name = "mine"\nsource = {{ local = "{work / "models" / "mine"}" }}\ntargets = ["v79"]\n'
    (work / "specs" / "mine.toml").write_text(spec)
    before = tree_state(work / "models")
    proc = doit(None, "fetch:mine", MNNBUILD_ARTIFACTS=str(work / "models"), MNNBUILD_MODELS_PATH=str(work / "specs"))
    touched = tree_state(work / "models") != before
    held = not touched and proc.returncode != 0 and one_line(proc) and "holds model directory" in proc.stderr
    return Outcome(held, proc.returncode, last_lines(proc), touched)


@case("foreign-dir-at-stage-path", "1", "a folder of the user's where a stage writes; doit fetch, doit clean")
def foreign_dir_at_stage_path(work: Path, shared: Shared) -> Outcome:
    root = work / "art"
    before = user_files(root / "tiny-qwen3" / "model")
    proc = doit(root, "fetch:tiny-qwen3")
    clean = doit(root, "clean", "fetch:tiny-qwen3")
    touched = tree_state(root / "tiny-qwen3" / "model") != before
    held = not touched and proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    saw = f"{last_lines(proc, needle='OutputError')} || doit clean: {last_lines(clean, needle='not removed')}"
    return Outcome(held, proc.returncode, saw, touched)


# -- item 2: destructive cache commands ------------------------------------------------------------------------------


@case("prune-any-dir", "2", "cache prune --url ~/Documents --max-size 1 (report.tmp-final.docx, 2 h old)")
def prune_any_dir(work: Path, shared: Shared) -> Outcome:
    docs = work / "Documents"
    (docs / "blobs").mkdir(parents=True)
    aged(_write(docs / "report.tmp-final.docx", b"the report"))
    aged(_write(docs / "blobs" / "photo.jpg", b"jpg"))
    before = tree_state(docs)
    proc = cli("cache", "prune", "--max-size", "1", "--url", str(docs))
    touched = tree_state(docs) != before
    return Outcome(not touched and proc.returncode != 0 and one_line(proc), proc.returncode, last_lines(proc), touched)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _prune_size(size: str) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        cache = small_cache(work)
        before = tree_state(cache)
        proc = cli("cache", "prune", f"--max-size={size}", "--url", str(cache))
        touched = tree_state(cache) != before
        held = not touched and proc.returncode != 0 and one_line(proc)
        return Outcome(held, proc.returncode, last_lines(proc), touched)

    return run


for _size in ("-5G", "0", "1e999"):
    case(f"prune-size-{_size}", "2", f"cache prune --max-size={_size}")(_prune_size(_size))


@case("prune-user-tmp-names", "2", "a file named x.tmp-y of the user's inside a real cache; cache prune")
def prune_user_tmp_names(work: Path, shared: Shared) -> Outcome:
    cache = small_cache(work)
    mine = aged(_write(cache / "report.tmp-final.docx", b"mine"))
    proc = cli("cache", "prune", "--max-size", "1G", "--url", str(cache))
    touched = not mine.exists()
    return Outcome(not touched and proc.returncode == 0, proc.returncode, last_lines(proc), touched)


# -- item 3: the runtime and links in a bundle ---------------------------------------------------------------------


def _linked_bundle_file(rel: str) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        root = shared.bundle_copy(work / "artifacts")
        bundle = root / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"
        link_out(bundle, rel, work)
        code = (
            "import sys; from mnnbuild_runtime import Bundle, BundleError\n"
            "try: Bundle.open(sys.argv[1]); print('opened')\n"
            "except BundleError as exc: sys.exit(f'BundleError: {exc}')"
        )
        proc = subprocess.run([sys.executable, "-c", code, str(bundle)], capture_output=True, text=True,
                              env=clean_env(), timeout=300)  # fmt: skip
        held = proc.returncode != 0 and "is a symlink" in proc.stderr
        return Outcome(held, proc.returncode, last_lines(proc))

    return run


for _rel in ("qnn/graphllm0.bin", "qnn/llm.mnn", "llm.mnn.weight", "config_qnn.json"):
    case(f"runtime-link-{_rel}", "3", f"{_rel} in a bundle is a symlink to a file outside; Bundle.open")(
        _linked_bundle_file(_rel)
    )


# -- item 4: manifest paths outside the stage dir --------------------------------------------------------------------


@case("manifest-lists-outside-file", "4", "bundle.manifest.json lists ../../../../<a file outside>; doit bundle")
def manifest_lists_outside_file(work: Path, shared: Shared) -> Outcome:
    from mnnbuild.base.fsutil import sha256_file

    root = shared.bundle_copy(work / "artifacts")
    bundle = root / "tiny-qwen3" / "v79" / "bundle"
    secret = work / "hostname"
    secret.write_text("box\n")
    path = bundle / "bundle.manifest.json"
    manifest = json.loads(path.read_text())
    rel = os.path.relpath(secret, bundle)
    manifest["outputs"].append({"path": rel, "size": secret.stat().st_size, "sha256": sha256_file(secret)})
    path.write_text(json.dumps(manifest))
    proc = doit(root, "bundle:tiny-qwen3-v79")
    rebuilt = "bundle:tiny-qwen3-v79" in summary(proc).get("built", [])
    return Outcome(rebuilt and proc.returncode == 0, proc.returncode, "rebuilt" if rebuilt else "stayed up to date")


# -- item 5: processes that outlive the build ------------------------------------------------------------------------


def _kill_mid_compose(workers: str, sig: signal.Signals) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        marker = uuid.uuid4().hex
        env = clean_env(MNNBUILD_ARTIFACTS=str(work / "artifacts"), FAULT_MARKER=marker)
        argv = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "-n", workers]
        argv.append("bundle:tiny-qwen3-v79")
        with open(work / "doit.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not composing(marker) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(proc.pid, sig)
            proc.wait(timeout=120)
            deadline = time.monotonic() + 10
            while marked_processes(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = marked_processes(marker)
            saw = f"{len(left)} processes left 10 s later" + (
                ": " + ", ".join(cmd.split(" -c ")[-1][:40] for _, cmd in left.values()) if left else ""
            )
            return Outcome(not left, proc.returncode, saw)
        finally:
            for pid in marked_processes(marker):
                os.kill(pid, signal.SIGKILL)

    return run


case("kill-9-doit-mid-compose", "5", "kill -9 <doit pid> (that pid alone) while a context binary is composed")(
    _kill_mid_compose("0", signal.SIGKILL)
)
case("sigterm-doit-n2-mid-compose", "5", "SIGTERM to `doit -n 2` while its workers compose")(
    _kill_mid_compose("2", signal.SIGTERM)
)


# -- item 6: bounded requests ------------------------------------------------------------------------------------------


def bad_spec(work: Path, body: str, source: Path = TINY_MODEL_DIR, name: str = "bad") -> dict[str, str]:
    """A spec dir holding ``<name>.toml`` on ``source``: the env that finds it."""
    specs = work / "specs"
    specs.mkdir(exist_ok=True)
    text = f'name = "{name}"\nsource = {{ local = "{source}" }}\ntargets = ["v79"]\n{body}\n'
    (specs / f"{name}.toml").write_text(text)
    return {"MNNBUILD_MODELS_PATH": str(specs)}


def model_copy(work: Path, source: Path = TINY_MODEL_DIR, folder: str = "model", **llm_config: object) -> Path:
    """A copy of a model dir with ``llm_config.json`` fields replaced."""
    dest = work / folder
    shutil.copytree(source, dest)
    config = json.loads((dest / "llm_config.json").read_text())
    (dest / "llm_config.json").write_text(json.dumps({**config, **llm_config}))
    return dest


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The error line a user reads (doit follows a failed task's with its own trailer), else the last line."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR: ", "error: ")) or "Error: " in line]
    return (errors or lines or [""])[-1].strip()


def refused(proc: subprocess.CompletedProcess[str], expected: str) -> Outcome:
    """Held when the command failed with no traceback and the line the user read says ``expected``."""
    line = error_line(proc)
    held = proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr and expected in line
    return Outcome(held, proc.returncode, line)


def _spec_refused(body: str, expected: str, source: Path = TINY_MODEL_DIR) -> Callable[[Path, Shared], Outcome]:
    return lambda work, shared: refused(doit(work / "artifacts", "io:bad", **bad_spec(work, body, source)), expected)


FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "models"
case("chunk-sizes-2-to-1024", "6", "chunk_sizes = [2, 3, ..., 1024]; doit io")(
    _spec_refused(f"chunk_sizes = {list(range(2, 1025))}", "lists 1023 prefill lengths; at most 12")
)
case("image-99988x99988", "6", 'image_sizes = ["99988x99988"] (aligned, qwen2.5-vl); doit io')(
    _spec_refused(
        'family = "vl"\nvisual_encoder = "qwen2.5-vl"\nimage_sizes = ["99988x99988"]',
        "9997600144 pixels is more than the 12845056 MNN's engine resizes",
        FIXTURES / "qwen2.5-vl-tiny",
    )
)
case("chunk-over-max-kv-size", "6", "chunk_size = 256 with max_kv_size = 128; doit io")(
    _spec_refused("chunk_size = 256\nmax_kv_size = 128", "longer than max_kv_size = 128")
)
case("chunk-size-string", "6", 'chunk_size = "128"; doit io')(
    _spec_refused('chunk_size = "128"', "field 'chunk_size': Input should be a valid integer (got '128')")
)


@case("chunk-over-max-positions", "6", "llm_config.json max_position_embeddings 64, chunk_size 128; doit io")
def chunk_over_max_positions(work: Path, shared: Shared) -> Outcome:
    env = bad_spec(work, "chunk_size = 128", model_copy(work, max_position_embeddings=64))
    return refused(doit(work / "artifacts", "io:bad", **env), "field 'max_position_embeddings' is 64")


def _runtime_refused(code: str, expected: str) -> Outcome:
    """``code`` run as a runtime caller would, a BundleError shown as the one line it is."""
    script = (
        "import sys\nfrom mnnbuild_runtime import Bundle, BundleError, Embeddings\n"
        f"try:\n    {code}\nexcept BundleError as exc:\n    sys.exit(f'BundleError: {{exc}}')"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), timeout=300)
    return refused(proc, expected)


@case("runtime-chunk-limits-1e9", "6", "config_qnn.json chunk_limits [1000000000, 1]; Bundle.open")
def runtime_chunk_limits(work: Path, shared: Shared) -> Outcome:
    root = shared.bundle_copy(work / "artifacts")
    bundle = root / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"
    config = json.loads((bundle / "config_qnn.json").read_text())
    (bundle / "config_qnn.json").write_text(json.dumps({**config, "chunk_limits": [1_000_000_000, 1]}))
    return _runtime_refused(f"Bundle.open({str(bundle)!r})", "holds 1000000000, but plugin")


# -- item 7: self-consistent but misplaced outputs --------------------------------------------------------------------


def _swapped(stage: str, task: str) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        root = shared.bundle_copy(work / "artifacts")
        base = root / "tiny-qwen3" / "v79" / stage
        (base / "graphllm0").rename(base / "x")
        (base / "graphllm1").rename(base / "graphllm0")
        (base / "x").rename(base / "graphllm1")
        first = doit(root, task)
        second = doit(root, task)
        rebuilt = sorted(t for t in summary(first).get("built", []) if t.startswith(f"{stage}:"))
        held = (
            first.returncode == 0
            and second.returncode == 0
            and len(rebuilt) == 2
            and "Traceback" not in (first.stdout + first.stderr)
        )
        saw = f"exit {first.returncode}, rebuilt {' '.join(r.rsplit(':', 1)[1] for r in rebuilt) or 'nothing'}"
        return Outcome(held, first.returncode, saw if first.returncode == 0 else last_lines(first))

    return run


case("swapped-twin-dirs", "7", "twin/graphllm0 <-> twin/graphllm1; doit twin")(_swapped("twin", "twin:tiny-qwen3-v79"))
case("swapped-context-dirs", "7", "context/graphllm0 <-> context/graphllm1; doit bundle")(
    _swapped("context", "bundle:tiny-qwen3-v79")
)


# -- item 8: kill -9 with the cache off ------------------------------------------------------------------------------


@case("kill-9-keeps-finished-stages", "8", "kill -9 doit mid-build, cache off; doit again")
def kill_9_keeps_finished_stages(work: Path, shared: Shared) -> Outcome:
    root = work / "artifacts"
    argv = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "bundle:tiny-qwen3-v79"]
    with open(work / "doit.log", "w") as log:
        proc = subprocess.Popen(argv, env=clean_env(MNNBUILD_ARTIFACTS=str(root)), cwd=work, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    context = root / "tiny-qwen3" / "v79" / "context"
    while proc.poll() is None and time.monotonic() < deadline:
        if context.is_dir() and any(".tmp-" in p.name for p in context.iterdir()):
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    again = doit(root, "bundle:tiny-qwen3-v79")
    rows = summary(again)
    kept = [t for t in ("fetch:tiny-qwen3", "io:tiny-qwen3", "partition:tiny-qwen3") if t in rows.get("up to date", [])]
    saw = f"rebuilt {len(rows.get('built', []))}, kept {len(rows.get('up to date', []))} ({' '.join(kept)})"
    return Outcome(len(kept) == 3 and again.returncode == 0, again.returncode, saw)


# -- item 9: the family is read from the model ---------------------------------------------------------------------

case("vl-model-as-llm", "9", "Qwen2.5-VL model, spec without family = 'vl'; doit io")(
    _spec_refused("", "set spec field family = 'vl', visual_encoder = 'qwen2.5-vl'", FIXTURES / "qwen2.5-vl-tiny")
)
case("embedding-model-as-llm", "9", "embedding model, spec without family = 'embedding'; doit io")(
    _spec_refused("", "set spec field family = 'embedding'", FIXTURES / "qwen3-embedding-tiny")
)
case("text-llm-as-vl", "9", "the tiny text LLM, spec family = 'vl'; doit io")(
    _spec_refused(
        'family = "vl"\nvisual_encoder = "qwen3-vl"\nimage_sizes = ["64x64"]',
        "the model is a text LLM, but its spec says family = 'vl'",
    )
)


# -- item 10: wrong blame ----------------------------------------------------------------------------------------------


@case("wrong-hidden-size", "10", "llm_config.json hidden_size 64 (the model's is 128); doit io")
def wrong_hidden_size(work: Path, shared: Shared) -> Outcome:
    env = bad_spec(work, "", model_copy(work, hidden_size=64))
    return refused(doit(work / "artifacts", "io:bad", **env), "field 'hidden_size' is 64, but llm.mnn takes")


# -- item 11: tracebacks ----------------------------------------------------------------------------------------------

case("seed-negative", "11", "seed = -1; doit io")(
    _spec_refused("seed = -1", "field 'seed': Input should be greater than or equal to 0")
)


@case("log-level-bogus", "11", "MNNBUILD_LOG_LEVEL=bogus doit list")
def log_level_bogus(work: Path, shared: Shared) -> Outcome:
    proc = doit(work / "artifacts", "list", MNNBUILD_LOG_LEVEL="bogus")
    return refused(proc, "MNNBUILD_LOG_LEVEL='bogus': expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL")


@case("doit-db-a-directory", "11", "artifacts/.doit.db is a directory; doit list")
def doit_db_directory(work: Path, shared: Shared) -> Outcome:
    (work / "artifacts" / ".doit.db").mkdir(parents=True)
    return refused(doit(work / "artifacts", "list"), "doit's state file is a directory")


def _embeddings_refused(field: str, value: object, expected: str) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        model = model_copy(work, **{field: value})
        return _runtime_refused(f"Embeddings({str(model)!r})", expected)

    return run


case("runtime-hidden-size-x", "11", 'llm_config.json hidden_size "x"; the runtime\'s Embeddings')(
    _embeddings_refused("hidden_size", "x", "field 'hidden_size' must be an integer, got 'x'")
)
case("runtime-tie-embeddings-float", "11", "llm_config.json tie_embeddings with a float offset; Embeddings")(
    _embeddings_refused(
        "tie_embeddings", [190794, 256330.5, 16384, 4, 64], "field 'tie_embeddings' entry 1 must be an integer"
    )
)


def _inspect_refused(make: Callable[[Path], object], expected: str) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        path = work / "x.mnn"
        make(path)
        try:  # a FIFO used to hang inspect, waiting for a writer
            proc = subprocess.run([sys.executable, "-m", "mnnbuild", "inspect", str(path)], capture_output=True,
                                  text=True, env=clean_env(), timeout=60)  # fmt: skip
        except subprocess.TimeoutExpired:
            return Outcome(False, None, "no answer after 60 s")
        return refused(proc, expected)

    return run


def _sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with path.open("wb") as f:
            f.truncate(size)

    return make


case("inspect-fifo", "11", "python -m mnnbuild inspect <a FIFO>")(_inspect_refused(os.mkfifo, "is a FIFO"))
case("inspect-dev-zero", "11", "python -m mnnbuild inspect /dev/zero (a link to it)")(
    _inspect_refused(lambda p: p.symlink_to("/dev/zero"), "is a character device")
)
case("inspect-sparse-3g", "11", "python -m mnnbuild inspect <a 3 GB sparse file>")(
    _inspect_refused(_sparse(3 << 30), "3221225472 bytes is more than any flatbuffer holds")
)


# -- item 12: what the cache says ------------------------------------------------------------------------------------


@case("read-only-cache-bad-blob", "12", "a read-only cache (a real ro mount) with a corrupt blob")
def read_only_cache_bad_blob(work: Path, shared: Shared) -> Outcome:
    _, proc = restore_bad_blob_read_only(work)
    held = "discarded" not in proc.stderr and "entry kept" in proc.stderr
    return Outcome(held, proc.returncode, last_lines(proc, needle="WARNING"))


@case("cache-info-unusable", "12", "MNNBUILD_CACHE=nosuchscheme://x python -m mnnbuild cache info")
def cache_info_unusable(work: Path, shared: Shared) -> Outcome:
    proc = cli("cache", "info", MNNBUILD_CACHE="nosuchscheme://x")
    held = proc.returncode != 0 and "is off" not in proc.stderr and one_line(proc)
    return Outcome(held, proc.returncode, last_lines(proc))


# -- item 13: conform on any model ------------------------------------------------------------------------------------


def _renamed(work: Path) -> dict[str, str]:
    """Spec ho-x on a copy of the tiny model in a folder named otherwise, and its artifact root."""
    env = bad_spec(work, "", model_copy(work, folder="qwen3-tiny-folder"), name="ho-x")
    return {**env, "MNNBUILD_ARTIFACTS": str(work / "artifacts")}


@case("conform-without-a-bundle", "13", "python -m mnnbuild conform ho-x-v79 before its bundle is built")
def conform_without_bundle(work: Path, shared: Shared) -> Outcome:
    return refused(cli("conform", "ho-x-v79", **_renamed(work)), "no finished bundle; run `doit bundle:ho-x-v79`")


@case("conform-out-a-users-dir", "13", "conform --out <a folder of the user's holding bundle/>")
def conform_out_users_dir(work: Path, shared: Shared) -> Outcome:
    env = _renamed(work)
    doit(work / "artifacts", "bundle:ho-x-v79", **env)
    mine = work / "Documents" / "bundle" / "thesis.tex"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    proc = cli("conform", "ho-x-v79", "--out", str(work / "Documents"), **env)
    outcome = refused(proc, "a directory conform did not make")
    outcome.outside_touched = mine.read_text() != "mine"
    outcome.held = outcome.held and not outcome.outside_touched
    return outcome


@case("conform-renamed-model", "13", "conform ho-x-v79 whole (MNN build included) on folder qwen3-tiny-folder")
def conform_renamed_model(work: Path, shared: Shared) -> Outcome:
    """Needs MNN_SOURCE and QNN headers (QNN_SDK_ROOT or FAULTS_QNN_HEADERS); the MNN build is reused from
    MNNBUILD_CONFORM_CACHE. Without them it is reported as not run."""
    source, headers = os.environ.get("MNN_SOURCE"), os.environ.get("FAULTS_QNN_HEADERS")
    if not source or not (headers or os.environ.get("QNN_SDK_ROOT")):
        return Outcome(False, None, "not run: set MNN_SOURCE and FAULTS_QNN_HEADERS (or QNN_SDK_ROOT)")
    env = _renamed(work)
    doit(work / "artifacts", "bundle:ho-x-v79", "twin:ho-x-v79", **env)
    conform_env = {k: os.environ[k] for k in ("MNN_SOURCE", "QNN_SDK_ROOT") if k in os.environ}
    if "MNNBUILD_CONFORM_CACHE" in os.environ:
        conform_env["MNNBUILD_CONFORM_CACHE"] = os.environ["MNNBUILD_CONFORM_CACHE"]
    argv = ["conform", "ho-x-v79", *([f"--qnn-headers={headers}"] if headers else [])]
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", *argv], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, env=clean_env(**env, **conform_env), timeout=7200)  # fmt: skip
    verdict = next((line for line in proc.stdout.splitlines() if line.startswith("conform ho-x-v79")), "")
    return Outcome(proc.returncode == 0 and "PASSED" in verdict, proc.returncode, verdict or error_line(proc))


# -- issue 43: the cache never fails a build; a verified bundle loads ---------------------------------------------


def _warm(work: Path) -> tuple[Path, dict[str, str]]:
    """A cache filled by one cold bare `doit` (its own), and the env of a fresh root on it."""
    cache = work / "cache"
    proc = doit(work / "cold", MNNBUILD_CACHE=str(cache))
    if proc.returncode != 0:
        raise RuntimeError(f"the cold build failed:\n{proc.stdout}\n{proc.stderr}")
    return cache, {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(work / "warm")}


def _warnings(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith(("W ", "WARNING"))]


@case("cache-off-deferred-verify", "43.1", "warm cache; doit clean verify; MNNBUILD_CACHE=off doit verify")
def cache_off_deferred_verify(work: Path, shared: Shared) -> Outcome:
    _, env = _warm(work)
    doit(None, **env)
    doit(None, "clean", "verify:tiny-qwen3-v79", **env)
    proc = doit(None, "verify:tiny-qwen3-v79", **{**env, "MNNBUILD_CACHE": "off"})
    held = proc.returncode == 0 and len(_warnings(proc)) == 1
    return Outcome(held, proc.returncode, last_lines(proc, needle="cache is off"))


@case("local-context-blob-flipped", "43.1", "one byte of the context blob behind qnn/graphllm1.bin; doit bundle:")
def local_context_blob_flipped(work: Path, shared: Shared) -> Outcome:
    cache, env = _warm(work)
    key = json.loads((work / "cold/tiny-qwen3/v79/context/graphllm1/context.origin.json").read_text())["key"]
    entry = json.loads((cache / "context" / f"{key}.json").read_text())
    sha = next(f["sha256"] for f in entry["files"] if f["path"] == "qnn/graphllm1.bin")
    blob = cache / "blobs" / sha[:2] / sha
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.unlink()  # a hard link to the cold root's file: a new file, not an edit of that one
    blob.write_bytes(bytes(data))
    proc = doit(None, "bundle:tiny-qwen3-v79", **env)
    held = proc.returncode == 0 and len(_warnings(proc)) == 1
    return Outcome(held, proc.returncode, last_lines(proc, needle="sha256"))


@case("restored-verify-touch-r", "43.2", "verify restored; llm_config.json edited, size and mtime kept; doit verify")
def restored_verify_touch_r(work: Path, shared: Shared) -> Outcome:
    _, env = _warm(work)
    doit(None, "bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79", **env)
    config = work / "warm/tiny-qwen3/v79/bundle/model/tiny-qwen3/llm_config.json"
    st, text = config.stat(), config.read_text()
    at = text.index("64", text.index('"tie_embeddings"'))
    config.write_text(text[:at] + "65" + text[at + 2 :])
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = doit(None, "verify:tiny-qwen3-v79", **env)
    held = proc.returncode != 0 and "verify:tiny-qwen3-v79" in (proc.record or {}).get("failed", {})
    return Outcome(held, proc.returncode, last_lines(proc, needle="Error"))


# -- issue 43 ("Trust, third round"), items 3 to 8 --------------------------------------------------------------------


def _tokenizer(data: bytes) -> Callable[[Path, Shared], Outcome]:
    def run(work: Path, shared: Shared) -> Outcome:
        model = model_copy(work)
        (model / "tokenizer.mtok").write_bytes(data)
        proc = doit(work / "artifacts", "io:bad", **bad_spec(work, "", model))
        return refused(proc, f"{model / 'tokenizer.mtok'}: is ")

    return run


case("tokenizer-empty", "43.3", "an empty tokenizer.mtok; doit io (was SIGSEGV, rc 139, no line)")(_tokenizer(b""))
case("tokenizer-random-30k", "43.3", "30 kB of random bytes as tokenizer.mtok; doit io")(_tokenizer(os.urandom(30_000)))


@case("spec-name-300-chars", "43.4", "a 300-character spec name (in m.toml); doit io")
def spec_name_300_chars(work: Path, shared: Shared) -> Outcome:
    env = bad_spec(work, "", name="m")
    spec = Path(env["MNNBUILD_MODELS_PATH"]) / "m.toml"
    spec.write_text(spec.read_text().replace('name = "m"', f'name = "{"m" * 300}"'))
    proc = doit(work / "artifacts", f"io:{'m' * 300}", **env)
    return refused(proc, "field 'name': String should have at most 100 characters")


case("materialize-empty-name", "43.4", "python -m mnnbuild cache materialize ''")(
    lambda work, shared: refused(cli("cache", "materialize", ""), "not a task name")
)


def _q_proj_scales(damage: str) -> Callable[[Path, Shared], Outcome]:
    """The first conv's (q_proj's) scale bytes said 3072 instead of 2048, or made NaN, via mnnbuild.mnn."""

    def run(work: Path, shared: Shared) -> Outcome:
        from mnnbuild.mnn import conv_ops, load_model, save_model

        model = model_copy(work)
        graph = load_model(model / "llm.mnn")
        op = conv_ops(graph)[0]
        offset, weights, scales = (int(v) for v in op.main.external[:3])
        if damage == "3072":
            op.main.external = [*op.main.external[:2], 3072, *op.main.external[3:]]
            save_model(graph, model / "llm.mnn")
            expected = f"{model / 'llm.mnn'}: op '{op.name}': Convolution2D external[2]"
        else:
            data = bytearray((model / "llm.mnn.weight").read_bytes())
            data[offset + weights : offset + weights + scales] = b"\xff" * scales
            (model / "llm.mnn.weight").write_bytes(bytes(data))
            expected = f"{model / 'llm.mnn.weight'}: op '{op.name}': 512 of its 512 scales are not finite"
        return refused(doit(work / "artifacts", "io:bad", **bad_spec(work, "", model)), expected)

    return run


case("q-proj-scale-bytes-3072", "43.5", "int4 q_proj external[2] 3072 (not 2048); doit io")(_q_proj_scales("3072"))
case("q-proj-scales-nan", "43.5", "int4 q_proj scale bytes all 0xff (NaN); doit io")(_q_proj_scales("nan"))
case("layer-nums-negative", "43.5", "llm_config.json layer_nums = -1; doit io (was shipped)")(
    lambda work, shared: refused(
        doit(work / "artifacts", "io:bad", **bad_spec(work, "", model_copy(work, layer_nums=-1))),
        "field 'layer_nums' must be a positive integer, got -1",
    )
)


@case("bundle-hidden-size-1e12", "43.5", "a bundle's llm_config.json hidden_size 10^12; Embeddings")
def bundle_hidden_size(work: Path, shared: Shared) -> Outcome:
    root = shared.bundle_copy(work / "artifacts")
    bundle = root / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"
    config = json.loads((bundle / "llm_config.json").read_text())
    (bundle / "llm_config.json").write_text(json.dumps({**config, "hidden_size": 10**12}))
    return _runtime_refused(f"Embeddings({str(bundle)!r})", "llm_config.json: field 'hidden_size' is 1000000000000")


@case("plugin-offset-past-end", "43.6", "a Plugin's offset attribute past the end of its file, no size; Bundle.open")
def plugin_offset_past_end(work: Path, shared: Shared) -> Outcome:
    from mnnbuild.mnn import load_model, make_attribute, plugin_attributes, save_model

    root = shared.bundle_copy(work / "artifacts")
    bundle = root / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"
    graph = load_model(bundle / "qnn" / "llm.mnn")
    op = next(op for op in graph.ops if op.type == "Plugin")
    attrs = {**plugin_attributes(op), "offset": [1 << 30, 0]}
    op.main.attr = [make_attribute(k, attrs[k]) for k in sorted(attrs)]
    save_model(graph, bundle / "qnn" / "llm.mnn")
    return _runtime_refused(f"Bundle.open({str(bundle)!r})", "attribute 'offset' is 1073741824 without a 'size'")


@case("subtask-by-name", "43.7", "doit context:tiny-qwen3-v79:graphllm0 (a name doit list --all shows)")
def subtask_by_name(work: Path, shared: Shared) -> Outcome:
    root = shared.bundle_copy(work / "artifacts")
    doit(root, "clean", "context:tiny-qwen3-v79:graphllm0")
    proc = doit(root, "context:tiny-qwen3-v79:graphllm0")
    ran = ".  context:tiny-qwen3-v79:graphllm0" in proc.stdout
    return Outcome(proc.returncode == 0 and ran, proc.returncode, last_lines(proc))


@case("status-after-warm-doit", "43.7", "a warm bare doit in a fresh root, then python -m mnnbuild status")
def status_after_warm_doit(work: Path, shared: Shared) -> Outcome:
    cache = str(work / "cache")
    doit(work / "cold", MNNBUILD_CACHE=cache)
    doit(work / "warm", MNNBUILD_CACHE=cache)
    status = cli("status", MNNBUILD_CACHE=cache, MNNBUILD_ARTIFACTS=str(work / "warm"))
    again = doit(work / "warm", MNNBUILD_CACHE=cache)
    agree = status.stdout.strip().endswith("nothing would run") and ".  " not in again.stdout
    return Outcome(agree and status.returncode == 0, status.returncode, last_lines(status))


@case("ctrl-c-run-record", "43.8", "Ctrl-C mid compose in a root whose .doit-run.json says the context was built")
def ctrl_c_run_record(work: Path, shared: Shared) -> Outcome:
    root = work / "artifacts"
    root.mkdir()
    (root / ".doit-run.json").write_text(json.dumps({"built": ["context:tiny-qwen3-v79:graphllm0"]}))
    marker = uuid.uuid4().hex
    env = clean_env(MNNBUILD_ARTIFACTS=str(root), FAULT_MARKER=marker)
    argv = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "bundle:tiny-qwen3-v79"]
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not composing(marker) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    record = json.loads((root / ".doit-run.json").read_text())
    held = record.get("interrupted") == "stopped by Ctrl-C" and bool(record.get("running"))
    return Outcome(held, proc.returncode, f"interrupted={record.get('interrupted')!r} running={record.get('running')}")


# -- running the table ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="run the cases whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    chosen = [c for c in CASES if not args.only or any(part in c.name for part in args.only)]
    if args.list:
        print_table(["case", "item", "the bad thing"], [(c.name, c.item, c.bad_thing) for c in chosen], left=True)
        return 0
    results = []
    global NEUTRAL_CWD
    with tempfile.TemporaryDirectory(prefix="mnnbuild-faults-") as tmp:
        NEUTRAL_CWD = Path(tmp) / "cwd"
        shared = Shared(Path(tmp) / "shared")
        for n, c in enumerate(chosen):
            work = Path(tmp) / f"{n:02d}-{c.name}"
            work.mkdir(parents=True)
            started = time.perf_counter()
            try:
                outcome = c.run(work, shared)
            except Exception as exc:  # noqa: BLE001 - a case that breaks is a row, not the end of the table
                outcome = Outcome(False, None, f"the case itself failed: {type(exc).__name__}: {exc}")
            # the temp dirs say nothing; a row should fit a terminal
            outcome.saw = outcome.saw.replace(str(work), "<tmp>").replace(str(PROJECT_ROOT), "<project>")[:200]
            results.append({"name": c.name, "item": c.item, "bad_thing": c.bad_thing,
                            "seconds": round(time.perf_counter() - started, 1), **asdict(outcome)})  # fmt: skip
            sys.stderr.write(f"{c.name}: {'held' if outcome.held else 'BROKEN'}\n")
    print_table(
        ["case", "item", "held", "exit", "outside touched", "what the user saw"],
        [
            (
                r["name"],
                r["item"],
                "yes" if r["held"] else "NO",
                r["exit"],
                {None: "-", True: "YES", False: "no"}[r["outside_touched"]],
                r["saw"],
            )
            for r in results
        ],  # fmt: skip
        left=True,
    )
    held = sum(r["held"] for r in results)
    path = RECORD
    record = {"machine": machine(), "commit": checkout_commit(), "only": args.only}
    path.write_text(json.dumps({**record, "cases": results, "held": held, "of": len(results)}, indent=2) + "\n")
    sys.stdout.write(f"{sum(r['held'] for r in results)} of {len(results)} held; {path}\n")
    return 0 if all(r["held"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
