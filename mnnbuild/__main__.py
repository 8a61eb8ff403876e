"""Command line: ``python -m mnnbuild <subcommand> ...``.

A small argparse dispatcher: each subcommand registers a parser and a handler ``(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import mnnbuild
from mnnbuild.base.child import skip_final_collection
from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.logs import configure_logging
from mnnbuild.base.sizes import human_bytes, parse_size

if TYPE_CHECKING:
    from mnnbuild.pipeline.cache import CacheUsage

Handler = Callable[[argparse.Namespace], int]


def _inspect(args: argparse.Namespace) -> int:
    from mnnbuild.mnn import check_weight_ranges, load_model, summarize, weight_path_for
    from mnnbuild.mnn.summary import format_summary

    model = load_model(args.model)
    summary = summarize(model)
    if weight_path_for(args.model).exists():
        check_weight_ranges(model, weight_path_for(args.model))
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        sys.stdout.write(format_summary(summary))
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarize an .mnn model (ops, inputs, outputs, weights)")
    p.add_argument("model", help="path to a .mnn file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_inspect)


def _cache(args: argparse.Namespace) -> int:
    from mnnbuild.pipeline.cache import (
        CACHE_ENV,
        READONLY_ENV,
        REMOTE_ENV,
        ArtifactCache,
        CacheError,
        remote_readonly,
        remote_url,
    )

    if args.action == "materialize":
        return _materialize(args)
    max_size = parse_size(args.max_size) if args.max_size is not None else None  # before touching the cache
    if args.remote and args.url is None:
        url = remote_url(os.environ)
        if url is None:
            raise CacheError(f"--remote: {REMOTE_ENV} names no remote cache")
        if args.action == "prune" and remote_readonly(os.environ):
            raise CacheError(f"{READONLY_ENV} is set: this runner does not prune the remote {url}")
        cache = ArtifactCache.named(url=url)
    else:
        cache = ArtifactCache.named(url=args.url)
    if cache is None:
        off = f"{CACHE_ENV}={os.environ.get(CACHE_ENV, '')!r}"
        sys.stderr.write(f"the artifact cache is off ({off}); --url names one\n")
        return 1
    problem = cache.probe()
    if problem is not None:
        raise MnnbuildError(f"{cache.url} is {problem}; left as it is")
    if args.action == "prune":
        if max_size is None:
            raise MnnbuildError("cache prune needs --max-size (e.g. --max-size 20G)")
        removed, freed = cache.prune(max_size)
        sys.stdout.write(f"{cache.url}: removed {removed} entries, freed {human_bytes(freed)}\n")
    usage = cache.usage()
    sys.stdout.write(format_usage(cache.url, usage))
    return 0


def format_usage(url: str, usage: CacheUsage) -> str:
    """``cache info``: entries per stage, the cache's size, and what each stage costs in it (the bytes of the blobs
    its entries reference; a blob two stages share, such as a context binary the bundle ships, counts for both)."""
    stages: dict[str, int] = {}
    for entry in usage.entries:
        stages[entry.stage] = stages.get(entry.stage, 0) + 1
    per_stage = ", ".join(f"{stage} {n}" for stage, n in sorted(stages.items())) or "none"
    partial = ""
    if usage.partial:
        size = human_bytes(sum(n for n, _ in usage.partial.values()))
        partial = f", {len(usage.partial)} partial writes ({size}; prune removes those older than an hour)"
    shared = ""
    if usage.shared_bytes:
        shared = f" ({human_bytes(usage.shared_bytes)} of it hard links to artifact files: on disk once)"
    lines = [
        f"{url}: {len(usage.entries)} entries ({per_stage}), {len(usage.blobs)} blobs, "
        f"{human_bytes(usage.total_bytes)}{shared}{partial}"
    ]
    cost = usage.bytes_by_stage()
    for stage, size in sorted(cost.items(), key=lambda item: -item[1]):
        share = 100 * size / usage.total_bytes if usage.total_bytes else 0.0
        lines.append(f"  {stage:10} {stages[stage]:4} entries  {human_bytes(size):>9}  {share:5.1f}%")
    return "\n".join(lines) + "\n"


def _materialize(args: argparse.Namespace) -> int:
    """``cache materialize <task>``: the task's outputs with their files (fetched from the cache when they were
    restored without them): ``doit <task>`` on the project's dodo.py, which asks for the task by name."""
    import subprocess
    from pathlib import Path

    import mnnbuild

    if not args.tasks:
        raise MnnbuildError("cache materialize needs a task name (e.g. twin:tiny-qwen3-v79)")
    project = Path(args.project) if args.project else Path(mnnbuild.__file__).resolve().parent.parent
    dodo = project / "dodo.py"
    if not dodo.is_file():
        raise MnnbuildError(f"--project {project}: no dodo.py there; expected an mnnbuild checkout")
    bad = [t for t in args.tasks if not t.strip() or t.startswith("-") or "=" in t]
    if bad:
        raise MnnbuildError(f"cache materialize {bad[0]!r}: not a task name; expected one such as io:tiny-qwen3")
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(dodo), *args.tasks], check=False).returncode


def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show, prune or materialize the artifact cache (MNNBUILD_CACHE, _REMOTE)")
    p.add_argument("action", choices=["info", "prune", "materialize"])
    p.add_argument("tasks", nargs="*", help="materialize: the tasks whose outputs to fetch with their files")
    p.add_argument("--max-size", help="prune: keep the most recently used entries within this size (20G, 500M)")
    p.add_argument("--url", help="a cache other than MNNBUILD_CACHE's (a path or fsspec URL)")
    p.add_argument("--remote", action="store_true", help="the remote tier (MNNBUILD_CACHE_REMOTE) instead")
    p.add_argument("--project", help="materialize: the mnnbuild checkout (default: this package's)")
    p.set_defaults(handler=_cache)


def _add_conform(sub: argparse._SubParsersAction) -> None:
    from mnnbuild.conform.cli import add_parser

    add_parser(sub)


def _status(args: argparse.Namespace) -> int:
    from mnnbuild.dag.status import run

    dodo = Path(args.dodo) if args.dodo else Path.cwd() / "dodo.py"
    if not dodo.is_file() and not args.dodo:
        dodo = Path(__file__).resolve().parent.parent / "dodo.py"  # a checkout's own
    if not dodo.is_file():
        raise MnnbuildError(f"{dodo}: no dodo.py there; run from the project's directory or pass --dodo")
    return run(dodo, args.tasks)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="say why each task would run (changed input, parameter, code, tool, output)")
    p.add_argument("tasks", nargs="*", metavar="TASK", help="tasks to look at (default: what a bare `doit` runs)")
    p.add_argument("--dodo", help="the project's dodo.py (default: ./dodo.py, else the checkout's)")
    p.set_defaults(handler=_status)


def _dag(args: argparse.Namespace) -> int:
    from mnnbuild.stages.chain import CHAIN

    sys.stdout.write(CHAIN.table() if args.table else CHAIN.mermaid())
    return 0


def _add_dag(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dag", help="print the stage DAG as a Mermaid flowchart (generated from the stage list)")
    p.add_argument("--table", action="store_true", help="print the stage table of the README and docs/design.md")
    p.set_defaults(handler=_dag)


# subcommand registrars; add new ones here
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_inspect,
    _add_cache,
    _add_conform,
    _add_status,
    _add_dag,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnnbuild", description="Build MNN LLM bundles for Qualcomm NPUs.")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="debug logging (also what MNN and QNN print)")
    loud.add_argument("-q", "--quiet", action="store_true", help="errors only")
    parser.add_argument("--version", action="version", version=f"mnnbuild {mnnbuild.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` by ``parser``, options anywhere among a subcommand's task names: argparse ends a ``nargs="*"``
    list at the first option (``cache materialize --project X task`` left ``task`` over), and its
    ``parse_intermixed_args`` takes no subcommands, so the words left after the options join the list."""
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "tasks", None), list) and not any(w.startswith("-") for w in extra):
        args.tasks.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    handler: Handler = args.handler
    try:
        # -v / -q over MNNBUILD_LOG_LEVEL over warnings only
        configure_logging("DEBUG" if args.verbose else "ERROR" if args.quiet else None, default="WARNING")
        return handler(args)
    except MnnbuildError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    skip_final_collection()
    raise SystemExit(main())
