"""Replay issue 27's bad inputs (items 6, 9, 10, 11, 13) and print what the user saw: exit code and error line.

Each case is a name, the issue item, a setup that writes its spec, model copy or bundle into a temp dir and returns
the command a user would type, and the text the line the user reads must hold (the last error line: doit follows a
failed task's with a trailer; else the last line). A case holds when the command exits non-zero (or zero, for the
one that must pass) within its timeout, prints no traceback, and that line holds the text.
The table and ``benchmarks/results/faults_inputs.json`` say which held. The doit cases run with the cache off
under a temp artifact root; ``chunk-limits-1e9`` builds the tiny bundle once (a minute or two). With
``--mnn-source`` and ``--qnn-headers`` the ``conform-renamed`` case runs conform whole on a spec named unlike its
model's folder (the MNN build is reused from ``$MNNBUILD_CONFORM_CACHE``); without them it is skipped.

    python benchmarks/faults_inputs.py [--only NAME ...] [--mnn-source SRC --qnn-headers DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

TINY = PROJECT_ROOT / "models" / "tiny-qwen3"
FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "models"


@dataclass
class Run:
    """What a case runs: the command, its extra environment, and how long it may take."""

    argv: list[str]
    env: dict[str, str]
    timeout: float = 600


@dataclass(frozen=True)
class Case:
    name: str
    item: int
    setup: Callable[[Path, argparse.Namespace], Run]
    expected: str
    """Text the last line of output must hold."""
    succeeds: bool = False


def doit(work: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    base = {"MNNBUILD_ARTIFACTS": str(work / "artifacts"), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"}
    return Run([sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *args], {**base, **(env or {})})


def spec(work: Path, body: str, source: Path = TINY, name: str = "bad") -> dict[str, str]:
    """A spec dir holding ``<name>.toml`` on ``source``; returns the env that finds it."""
    specs = work / "specs"
    specs.mkdir(exist_ok=True)
    (specs / f"{name}.toml").write_text(
        f'name = "{name}"\nsource = {{ local = "{source}" }}\ntargets = ["v79"]\n{body}\n'
    )
    return {"MNNBUILD_MODELS_PATH": str(specs)}


def model_copy(work: Path, source: Path = TINY, folder: str = "model", **llm_config: Any) -> Path:
    """A copy of a model dir, with ``llm_config.json`` fields replaced."""
    dest = work / folder
    shutil.copytree(source, dest)
    config = json.loads((dest / "llm_config.json").read_text())
    (dest / "llm_config.json").write_text(json.dumps({**config, **llm_config}))
    return dest


def spec_case(body: str, source: Path = TINY) -> Callable[[Path, argparse.Namespace], Run]:
    return lambda work, _: doit(work, "io:bad", env=spec(work, body, source))


def llm_config_case(**fields: Any) -> Callable[[Path, argparse.Namespace], Run]:
    return lambda work, _: doit(work, "io:bad", env=spec(work, "", model_copy(work, **fields)))


def embeddings_case(**fields: Any) -> Callable[[Path, argparse.Namespace], Run]:
    def setup(work: Path, _: argparse.Namespace) -> Run:
        model = model_copy(work, **fields)
        code = f"from mnnbuild_runtime import Embeddings; Embeddings({str(model)!r})"
        return Run([sys.executable, "-c", _one_line(code)], {})

    return setup


def _one_line(code: str) -> str:
    """Python that prints a BundleError as the one line a caller would show, exit 2 (other errors: a traceback)."""
    return f"import sys\nfrom mnnbuild.errors import MnnbuildError\ntry:\n    {code}\nexcept MnnbuildError as e:\n" \
           "    sys.exit(f'error: {e}')"  # fmt: skip


def inspect_case(make: Callable[[Path], None]) -> Callable[[Path, argparse.Namespace], Run]:
    def setup(work: Path, _: argparse.Namespace) -> Run:
        path = work / "x.mnn"
        make(path)
        return Run([sys.executable, "-m", "mnnbuild", "inspect", str(path)], {}, timeout=30)

    return setup


def _sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with path.open("wb") as f:
            f.truncate(size)

    return make


def log_level(work: Path, _: argparse.Namespace) -> Run:
    return doit(work, "list", env={"MNNBUILD_LOG_LEVEL": "bogus"})


def doit_db_dir(work: Path, _: argparse.Namespace) -> Run:
    (work / "artifacts" / ".doit.db").mkdir(parents=True)
    return doit(work, "list")


_TINY_BUNDLE: list[Path] = []


def chunk_limits(work: Path, _: argparse.Namespace) -> Run:
    """The tiny bundle (built once per replay) with ``chunk_limits [1000000000, 1]``, opened as a caller would."""
    if not _TINY_BUNDLE:
        root = Path(tempfile.mkdtemp(prefix="faults-bundle-"))
        run = doit(root, "bundle:tiny-qwen3-v79")
        subprocess.run(run.argv, env={**os.environ, **run.env}, check=True, capture_output=True, cwd=root)
        _TINY_BUNDLE.append(root / "artifacts" / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3")
    bundle = work / "tiny-qwen3"
    shutil.copytree(_TINY_BUNDLE[0], bundle)
    config = json.loads((bundle / "config_qnn.json").read_text())
    (bundle / "config_qnn.json").write_text(json.dumps({**config, "chunk_limits": [1_000_000_000, 1]}))
    code = f"from mnnbuild_runtime import Bundle; Bundle.open({str(bundle)!r})"
    return Run([sys.executable, "-c", _one_line(code)], {})


def conform_no_bundle(work: Path, _: argparse.Namespace) -> Run:
    env = spec(work, "", model_copy(work, folder="qwen3-tiny-folder"), name="ho-x")
    return Run(
        [sys.executable, "-m", "mnnbuild", "conform", "ho-x-v79"],
        {**env, "MNNBUILD_ARTIFACTS": str(work / "artifacts"), "MNNBUILD_CACHE": "off"},
    )


def conform_renamed(work: Path, args: argparse.Namespace) -> Run:
    """The whole conform run, MNN build included, on spec ho-x whose model folder is qwen3-tiny-folder."""
    env = spec(work, "", model_copy(work, folder="qwen3-tiny-folder"), name="ho-x")
    build = doit(work, "bundle:ho-x-v79", "twin:ho-x-v79", env=env)
    subprocess.run(build.argv, env={**os.environ, **build.env}, check=True, capture_output=True, cwd=work)
    argv = [sys.executable, "-m", "mnnbuild", "conform", "ho-x-v79", f"--mnn-source={args.mnn_source}"]
    return Run([*argv, f"--qnn-headers={args.qnn_headers}"], build.env, timeout=7200)


CASES = [
    Case("chunk-sizes-1023", 6, spec_case(f"chunk_sizes = {list(range(2, 1025))}"), "lists 1023 prefill lengths"),
    Case(
        "image-99988",
        6,
        spec_case(
            'family = "vl"\nvisual_encoder = "qwen2.5-vl"\nimage_sizes = ["99988x99988"]', FIXTURES / "qwen2.5-vl-tiny"
        ),
        "9997600144 pixels is more than the 12845056",
    ),
    Case("chunk-over-kv-size", 6, spec_case("chunk_size = 256\nmax_kv_size = 128"), "longer than max_kv_size = 128"),
    Case(
        "chunk-over-positions",
        6,
        lambda work, _: doit(
            work, "io:bad", env=spec(work, "chunk_size = 128", model_copy(work, max_position_embeddings=64))
        ),
        "field 'max_position_embeddings' is 64",
    ),
    Case("chunk-limits-1e9", 6, chunk_limits, "field 'chunk_limits' [1000000000, 1] holds 1000000000"),
    Case(
        "chunk-size-string", 6, spec_case('chunk_size = "128"'), "field 'chunk_size': Input should be a valid integer"
    ),
    Case("vl-as-llm", 9, spec_case("", FIXTURES / "qwen2.5-vl-tiny"), "set spec field family = 'vl'"),
    Case(
        "embedding-as-llm", 9, spec_case("", FIXTURES / "qwen3-embedding-tiny"), "set spec field family = 'embedding'"
    ),
    Case(
        "llm-as-vl",
        9,
        spec_case('family = "vl"\nvisual_encoder = "qwen3-vl"\nimage_sizes = ["64x64"]'),
        "the model is a text LLM, but its spec says family = 'vl'",
    ),
    Case("wrong-hidden-size", 10, llm_config_case(hidden_size=64), "field 'hidden_size' is 64, but llm.mnn takes"),
    Case("seed-negative", 11, spec_case("seed = -1"), "field 'seed': Input should be greater than or equal to 0"),
    Case("log-level-bogus", 11, log_level, "MNNBUILD_LOG_LEVEL='bogus': expected one of DEBUG"),
    Case("doit-db-directory", 11, doit_db_dir, "doit's state file is a directory"),
    Case("runtime-hidden-size-x", 11, embeddings_case(hidden_size="x"), "field 'hidden_size' must be an integer"),
    Case(
        "runtime-tie-embeddings-float",
        11,
        embeddings_case(tie_embeddings=[190794, 256330.5, 16384, 4, 64]),
        "field 'tie_embeddings' entry 1 must be an integer",
    ),
    Case("inspect-fifo", 11, inspect_case(os.mkfifo), "is a FIFO, not an MNN model file"),
    Case("inspect-dev-zero", 11, inspect_case(lambda p: p.symlink_to("/dev/zero")), "is a character device"),
    Case("inspect-sparse-3g", 11, inspect_case(_sparse(3 << 30)), "is more than any flatbuffer holds"),
    Case("conform-no-bundle", 13, conform_no_bundle, "no finished bundle; run `doit bundle:ho-x-v79` first"),
    Case("conform-renamed", 13, conform_renamed, "report:", succeeds=True),
]


def replay(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"fault-{case.name}-") as tmp:
        work = Path(tmp)
        run = case.setup(work, args)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_") or k == "MNNBUILD_CONFORM_CACHE"}
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                run.argv, env={**env, **run.env}, cwd=work, capture_output=True, text=True, timeout=run.timeout
            )
            # a failure's line is on stderr; a success's last line is its report's, on stdout
            code, out = proc.returncode, proc.stdout + proc.stderr if proc.returncode else proc.stderr + proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, out = None, f"(no answer after {exc.timeout:.0f} s)"
        seconds = time.perf_counter() - started
    # this machine's paths by placeholders: the result is committed
    out = out.replace(str(work), "<tmp>").replace(str(PROJECT_ROOT), "<project>")
    lines = [line for line in out.splitlines() if line.strip()]
    # doit follows a failed task's error line with its own trailer: what the user reads is that error line
    errors = [line for line in lines if line.startswith(("ERROR: ", "error: ")) or "Error: " in line] if code else []
    last = (errors or lines or [""])[-1]
    exited = code is not None and (code == 0) == case.succeeds
    held = exited and "Traceback" not in out and case.expected in last
    return {
        "case": case.name,
        "item": case.item,
        "exit": code,
        "seconds": round(seconds, 2),
        "held": held,
        "last": last,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--mnn-source", help="conform-renamed: MNN source tree or tarball")
    parser.add_argument("--qnn-headers", help="conform-renamed: QNN headers dir (holds QnnInterface.h)")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    if not (args.mnn_source and args.qnn_headers):
        cases = [c for c in cases if c.name != "conform-renamed"]
    results = [replay(case, args) for case in cases]
    rows = [
        [r["case"], r["item"], r["exit"], r["seconds"], "yes" if r["held"] else "NO", r["last"][-110:]] for r in results
    ]
    print_table(["case", "item", "exit", "s", "held", "the line the user saw"], rows)
    path = write_results(
        "faults_inputs", {"cases": results, "held": sum(r["held"] for r in results), "of": len(results)}
    )
    sys.stdout.write(f"{sum(r['held'] for r in results)} of {len(results)} held; wrote {path}\n")
    return 0 if all(r["held"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
