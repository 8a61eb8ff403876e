"""Command line: ``python -m mnnbuild <subcommand> ...``.

A small argparse dispatcher: each subcommand registers a parser and a handler ``(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from mnnbuild.errors import MnnbuildError

Handler = Callable[[argparse.Namespace], int]


def _inspect(args: argparse.Namespace) -> int:
    from mnnbuild.mnn import load_model, summarize
    from mnnbuild.mnn.summary import format_summary

    summary = summarize(load_model(args.model))
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


# subcommand registrars; add new ones here
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_inspect]


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
