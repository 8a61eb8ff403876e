"""Shared bits of the benchmark scripts: where results go and how tables are printed."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    import os

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def checkout_commit(tree: Path = PROJECT_ROOT) -> str:
    """The commit ``tree`` has checked out (``+`` when it has changes), or ``unknown`` outside git: results are keyed
    by it, never by a directory (which is this machine's)."""
    run = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty=+", "--abbrev=12"],
                         capture_output=True, text=True)  # fmt: skip
    return run.stdout.strip() if run.returncode == 0 else "unknown"


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    # every result names the code it measured (the checkout's commit, + when it had changes)
    path.write_text(json.dumps({"machine": machine(), "commit": checkout_commit(), **data}, indent=2) + "\n")
    return path


def add_result(name: str, key: str, result: dict[str, Any]) -> Path:
    """Merge ``result`` into ``results/<name>.json`` under ``key``, keeping the other keys (earlier runs), with the
    checkout's commit unless ``result`` names its own."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["machine"] = machine()
    data[key] = {"commit": checkout_commit(), **result}  # a result's own "commit" (the code it timed) wins
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: bool = False) -> None:
    """Rows under their headers, numbers right-aligned (``left``: every column left-aligned, for text)."""
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if n and not left else c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    sys.stdout.write("\n".join(lines) + "\n")


class TreeRssSampler:
    """Samples the resident memory of a process and all its descendants (``/proc``) every ``interval`` seconds.

    ``getrusage(RUSAGE_CHILDREN)`` misses descendants nobody reaped, such as the forkserver workers that compose
    context binaries; sampling sees them. ``peak_process`` is the largest single process seen, ``peak_tree`` the
    largest sum over the tree at one sample (bytes). ``written`` is the bytes the tree's processes caused to be
    written to storage (``write_bytes`` of each thread's ``/proc/<pid>/task/<tid>/io``, its last sample; a thread's
    writes in its last ``interval`` before exit are missed)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import threading

        self.pid, self.interval = pid, interval
        self.peak_process = self.peak_tree = 0
        self._written: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _table() -> dict[int, tuple[int, int]]:
        """pid -> (parent pid, RSS bytes) of every process readable now."""
        import os

        page = os.sysconf("SC_PAGE_SIZE")
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                rss_pages = int((entry / "statm").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            found[int(entry.name)] = (ppid, rss_pages * page)
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            table = self._table()
            tree, frontier = set(), [self.pid]
            while frontier:
                p = frontier.pop()
                tree.add(p)
                frontier.extend(c for c, (ppid, _) in table.items() if ppid == p and c not in tree)
            for p in tree:
                # per thread: a process's own io also counts the children it reaped, which are sampled themselves
                for thread_io in (Path("/proc") / str(p) / "task").glob("*/io"):
                    try:
                        text = thread_io.read_text()
                    except OSError:
                        continue
                    written = next(int(x.split()[1]) for x in text.splitlines() if x.startswith("write_bytes"))
                    self._written[(p, int(thread_io.parent.name))] = written
            sizes = [table[p][1] for p in tree if p in table]
            if sizes:
                self.peak_process = max(self.peak_process, max(sizes))
                self.peak_tree = max(self.peak_tree, sum(sizes))

    @property
    def written(self) -> int:
        return sum(self._written.values())
