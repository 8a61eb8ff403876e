"""Command line: ``python -m mnnbuild <subcommand> ...``.

A small argparse dispatcher: each subcommand registers a parser and a handler ``(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable

from mnnbuild.base.errors import MnnbuildError

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


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``20G``, ``500M``, ``1048576`` -> bytes: a finite size of at least one byte, or a `MnnbuildError`."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1] if value and value[-1] in _UNITS else ""
    expected = "expected a size above 0 such as 20G, 500M or 1048576"
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise MnnbuildError(f"--max-size {text!r}: not a size; {expected}") from None
    if not math.isfinite(number) or number * _UNITS[unit] >= 1 << 63:
        raise MnnbuildError(f"--max-size {text!r}: too large; {expected}")
    size = int(number * _UNITS[unit])
    if size < 1:
        raise MnnbuildError(f"--max-size {text!r}: {'negative' if number < 0 else 'zero'}; {expected}")
    return size


def _cache(args: argparse.Namespace) -> int:
    from mnnbuild.pipeline.cache import ArtifactCache, human_bytes

    max_size = parse_size(args.max_size) if args.max_size is not None else None  # before touching the cache
    cache = ArtifactCache.named(url=args.url)
    if cache is None:
        sys.stderr.write("the artifact cache is off (MNNBUILD_CACHE=off)\n")
        return 1
    problem = cache.not_a_cache()
    if problem is not None:
        raise MnnbuildError(f"{problem}; not an mnnbuild cache, left as it is")
    if args.action == "prune":
        if max_size is None:
            raise MnnbuildError("cache prune needs --max-size (e.g. --max-size 20G)")
        removed, freed = cache.prune(max_size)
        sys.stdout.write(f"{cache.url}: removed {removed} entries, freed {human_bytes(freed)}\n")
    usage = cache.usage()
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
    sys.stdout.write(
        f"{cache.url}: {len(usage.entries)} entries ({per_stage}), {len(usage.blobs)} blobs, "
        f"{human_bytes(usage.total_bytes)}{shared}{partial}\n"
    )
    return 0


def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show or prune the artifact cache (MNNBUILD_CACHE)")
    p.add_argument("action", choices=["info", "prune"])
    p.add_argument("--max-size", help="prune: keep the most recently used entries within this size (20G, 500M)")
    p.add_argument("--url", help="a cache other than MNNBUILD_CACHE's (a path or fsspec URL)")
    p.set_defaults(handler=_cache)


def _add_conform(sub: argparse._SubParsersAction) -> None:
    from mnnbuild.conform.cli import add_parser

    add_parser(sub)


# subcommand registrars; add new ones here
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_inspect, _add_cache, _add_conform]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnnbuild", description="Build MNN LLM bundles for Qualcomm NPUs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    handler: Handler = args.handler
    try:
        return handler(args)
    except MnnbuildError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
