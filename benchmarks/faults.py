"""Fault injection: replay the cases of issue 27 ("Trust, second round") and print what a user sees.

Each case is a small function registered with ``@case``: it sets up a temp project, artifact root or cache, does
the bad thing a hostile but fair user (or the OOM killer) would, and returns an `Outcome`: whether the guarantee
held, the exit code, the last lines the user saw, and whether files outside what mnnbuild owns were touched. The
tests in ``tests/test_faults_fs.py`` assert the same cases; this script shows them side by side.

    python benchmarks/faults.py                 # every case -> table + benchmarks/results/faults.json
    python benchmarks/faults.py --only prune    # the cases whose name contains 'prune'
    python benchmarks/faults.py --list

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

sys.path.insert(0, str(PROJECT_ROOT))
from tests.conftest import TINY_MODEL_DIR, copy_project  # noqa: E402
from tests.test_cache import summary  # noqa: E402
from tests.test_faults_fs import (  # noqa: E402
    aged,
    composing,
    link_out,
    marked_processes,
    restore_bad_blob_read_only,
    small_cache,
    tree_state,
    user_files,
)


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


def doit(root: Path | None, *args: str, project: Path = PROJECT_ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``doit <args>`` on ``project``'s dodo.py into the artifact root ``root`` (None: whatever ``env`` says)."""
    if root is not None:
        env = {"MNNBUILD_ARTIFACTS": str(root), **env}
    cwd = root.parent if root is not None else Path(tempfile.gettempdir())
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(project / "dodo.py"), *args], cwd=cwd,
                          env=clean_env(**env), capture_output=True, text=True, timeout=900)  # fmt: skip


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
    from mnnbuild.fsutil import sha256_file

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
    rebuilt = "bundle:tiny-qwen3-v79" in summary(proc.stdout).get("built", [])
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
        rebuilt = sorted(t for t in summary(first.stdout).get("built", []) if t.startswith(f"{stage}:"))
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
    rows = summary(again.stdout)
    kept = [t for t in ("fetch:tiny-qwen3", "io:tiny-qwen3", "partition:tiny-qwen3") if t in rows.get("up to date", [])]
    saw = f"rebuilt {len(rows.get('built', []))}, kept {len(rows.get('up to date', []))} ({' '.join(kept)})"
    return Outcome(len(kept) == 3 and again.returncode == 0, again.returncode, saw)


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
    with tempfile.TemporaryDirectory(prefix="mnnbuild-faults-") as tmp:
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
    path = write_results("faults", {"only": args.only, "cases": results, "held": held, "of": len(results)})
    sys.stdout.write(f"{sum(r['held'] for r in results)} of {len(results)} held; {path}\n")
    return 0 if all(r["held"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
