"""Shared bits of the benchmark scripts: where results go and how tables are printed."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    import os

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if n else c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    sys.stdout.write("\n".join(lines) + "\n")
