"""The architecture matrix: every model of the zoo (``models/export/make_zoo.py``) built and verified with doit, its
NPU weights in float16 and in int4.

For each exported type of ``ZOO/zoo-summary.json``: two specs in a temporary spec dir (``zoo-<type>`` and
``zoo-<type>-int4``, chunk 32, v79), ``doit verify:<spec>-v79`` each (artifacts under ``--artifacts``, the cache
off), then from the run: passed or the failed task and its one-line reason, whether any traceback was printed, and
from ``partition.json`` the plugins, what stays on the CPU and its share of the weights. Writes
``benchmarks/results/archs.json`` and the table in ``docs/families.md`` (between its ``archs-table`` markers);
types the zoo did not export are listed with why. Not part of CI (each model takes ~0.5-1 min a build here).

    python models/export/make_zoo.py --out /tmp/zoo          # in the export venv
    python benchmarks/bench_archs.py --zoo /tmp/zoo [--artifacts DIR] [--only phi3 --only lfm2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

from mnnbuild.partition.records import PartitionReport  # noqa: E402

ARCH = "v79"
WEIGHTS = ("float16", "int4")
DOC = PROJECT_ROOT / "docs" / "families.md"
START, END = "<!-- archs-table:start -->", "<!-- archs-table:end -->"


def write_specs(zoo: Path, types: list[str], specs: Path) -> dict[tuple[str, str], str]:
    """(type, NPU weights) -> spec name, each spec written into ``specs``."""
    specs.mkdir(parents=True, exist_ok=True)
    names = {}
    for t in types:
        for weights in WEIGHTS:
            name = f"zoo-{t}" + ("" if weights == "float16" else f"-{weights}")
            (specs / f"{name}.toml").write_text(
                f'name = "{name}"\nsource = {{ local = "{zoo / t}" }}\nchunk_size = 32\ntargets = ["{ARCH}"]\n'
                f'npu_weights = "{weights}"\n',
                encoding="utf-8",
            )
            names[(t, weights)] = name
    return names


def run_verify(name: str, specs: Path, artifacts: Path) -> dict[str, Any]:
    """``doit verify:<name>-v79``: passed, or the failed task and its reason line; tracebacks seen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update({"MNNBUILD_MODELS_PATH": str(specs), "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_CACHE": "off"})
    # this checkout's mnnbuild, whichever the interpreter has installed
    path = [str(PROJECT_ROOT), str(PROJECT_ROOT / "runtime"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), f"verify:{name}-{ARCH}"],
        cwd=artifacts,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    failed = next((i for i, ln in enumerate(lines) if ln.startswith("failed  ")), None)
    result: dict[str, Any] = {
        "passed": proc.returncode == 0,
        "seconds": round(time.monotonic() - started, 1),
        "traceback": "Traceback (most recent call last)" in out,
    }
    if failed is not None:
        result["failed_task"] = lines[failed][len("failed  ") :].rstrip(":")
        result["reason"] = lines[failed + 1] if failed + 1 < len(lines) else ""
    elif proc.returncode != 0:
        result["reason"] = (out.strip().splitlines() or ["?"])[-1]
    if "reason" in result:  # the table goes into docs/: this machine's artifact dir stays out of it
        result["reason"] = result["reason"].replace(str(artifacts), "<artifacts>")
    return result


def partition_facts(artifacts: Path, name: str) -> dict[str, Any] | None:
    path = artifacts / name / "partition" / "partition.json"
    if not path.is_file():
        return None
    report = PartitionReport.model_validate_json(path.read_text(encoding="utf-8"))
    cpu_types = sorted({c.type for c in report.cpu_ops})
    return {
        "plugins": len(report.plugins),
        "cpu_ops": len(report.cpu_ops),
        "cpu_op_types": cpu_types,
        "cpu_weight_share": round(report.cpu_weight_share(), 4),
        "cpu_weight_bytes": report.cpu_weight_bytes,
    }


def _cell(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    if run["passed"]:
        return "yes"
    stage = str(run.get("failed_task", "?")).split(":", 1)[0]
    return f"no ({stage})"


_BUILD_STAGES = ("fetch", "io", "partition", "modellib", "context", "twin", "config", "bundle")
"""A run that failed at one of these did not build; at verify (or passed) it built."""

HEADERS = ["type", "llmexport layout", "builds", "verifies float16", "verifies int4", "stays on the CPU",
           "CPU weights", "plugins"]  # fmt: skip


def _built(run: dict[str, Any] | None) -> bool:
    return run is not None and str(run.get("failed_task", "")).split(":", 1)[0] not in _BUILD_STAGES


def table_rows(matrix: dict[str, Any]) -> list[list[str]]:
    """One row per zoo type (exported or not); the registered types outside the zoo are not rows."""
    rows = []
    for t, entry in sorted(matrix.items()):
        if entry.get("status") == "export failed":
            rows.append([f"`{t}`", "-", "no", "-", "-", f"llmexport fails: {entry.get('error', '')}", "-", "-"])
        if entry.get("status") != "exported":
            continue
        f16, i4 = entry["runs"].get("float16"), entry["runs"].get("int4")
        part = entry.get("partition") or {}
        share = f"{part['cpu_weight_share']:.1%}" if part else "-"
        rows.append([
            f"`{t}`", entry.get("llmexport_layout", ""), "yes" if _built(f16) or _built(i4) else "no", _cell(f16),
            _cell(i4), ", ".join(part.get("cpu_op_types", [])) or "-", share, str(part.get("plugins", "-")),
        ])  # fmt: skip
    return rows


def markdown(matrix: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table_rows(matrix)]
    failures = [
        f"- `{t}` {w}: `{run['failed_task']}`: {run['reason']}"
        for t, e in sorted(matrix.items())
        for w, run in e.get("runs", {}).items()
        if run and not run["passed"]
    ]
    if failures:
        lines += ["", "Failures, one line each (the failed task and its reason):", "", *failures]
    outside: dict[str, list[str]] = {}
    for t, e in sorted(matrix.items()):
        if e.get("status") == "not in the zoo":
            outside.setdefault(str(e.get("why")), []).append(f"`{t}`")
    if outside:
        lines += ["", "Registered by llmexport 0.0.5 but not in the zoo:", ""]
        lines += [f"- {why}: {', '.join(types)}" for why, types in outside.items()]
    return "\n".join(lines)


def update_doc(table: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    block = f"{START}\n{table}\n{END}"
    if START in text and END in text:
        text = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(DOC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, required=True, help="make_zoo.py's --out dir")
    parser.add_argument("--artifacts", type=Path, help="artifact root (default: a new temp dir)")
    parser.add_argument("--only", action="append", help="only these model types")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite the table in docs/families.md")
    args = parser.parse_args(argv)
    zoo = args.zoo.resolve()
    summary = json.loads((zoo / "zoo-summary.json").read_text(encoding="utf-8"))
    artifacts = (args.artifacts or Path(tempfile.mkdtemp(prefix="bench-archs-"))).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    exported = sorted(t for t, e in summary.items() if e.get("status") == "exported" and (zoo / t).is_dir())
    if args.only:
        exported = [t for t in exported if t in args.only]
    specs = Path(tempfile.mkdtemp(prefix="bench-archs-specs-"))  # outside the artifact root, which must be its own
    names = write_specs(zoo, exported, specs)
    matrix: dict[str, Any] = {}
    for t, entry in sorted(summary.items()):
        if args.only and t not in args.only:
            continue
        info = {
            k: entry.get(k) for k in ("status", "why", "error", "llmexport_layout", "dropped_norms", "norm_epsilons")
        }
        matrix[t] = {k: v for k, v in info.items() if v is not None}
        if t not in exported:
            continue
        matrix[t]["runs"] = {}
        for weights in WEIGHTS:
            run = run_verify(names[(t, weights)], specs, artifacts)
            matrix[t]["runs"][weights] = run
            verdict = "pass" if run["passed"] else "FAIL"
            sys.stdout.write(f"{t:<18} {weights:<8} {verdict} {run['seconds']:>6.1f} s {run.get('reason', '')[:160]}\n")
            sys.stdout.flush()
        matrix[t]["partition"] = partition_facts(artifacts, names[(t, "float16")])
    print_table(HEADERS, [r for r in table_rows(matrix) if len(r) == len(HEADERS)], left=True)
    tracebacks = sorted(f"{t} {w}" for t, e in matrix.items() for w, r in e.get("runs", {}).items() if r["traceback"])
    path = write_results("archs", {"arch": ARCH, "zoo": zoo.name, "matrix": matrix, "tracebacks": tracebacks})
    sys.stdout.write(f"wrote {path}; tracebacks: {tracebacks or 'none'}\n")
    if not args.no_doc and not args.only:
        update_doc(markdown(matrix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
