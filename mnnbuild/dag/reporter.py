"""doit's console output, ending with what the run did and what to do next.

A task's line is doit's (``.  name`` when it runs, ``-- name`` when up to date); the ending says how many tasks were
built, restored from the cache or up to date, how long the run took, where the bundle and its page report are and
how to push the bundle; on failure, the failing task, why (one line) and the file to read. The same facts go to
``<artifact root>/.doit-run.json`` for scripts (and tests), which the terminal no longer gets as lists of names.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from doit.exceptions import BaseFail, TaskError, TaskFailed
from doit.reporter import ConsoleReporter

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.fsutil import atomic_write_text
from mnnbuild.base.sizes import human_bytes
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.partition.records import PartitionReport
from mnnbuild.pipeline.layout import PARTITION_REPORT_JSON, PUSH_SCRIPT, REPORT_PAGE, RUN_SCRIPT, VERIFY_REPORT_TEXT

LAST_RUN = ".doit-run.json"
"""What the last doit run did, under the artifact root beside doit's own ``.doit.db`` (`BuildSummaryReporter`): a
record of the run, not an artifact."""

_SHOWN = 3
"""Bundles and reports named in the ending; more are counted."""

_PATH = re.compile(r"(/[^\s:;,'\"()]+)")


def shown(path: str | Path) -> str:
    """``path`` as a user reads it: relative to the current directory when it lies inside (``artifacts/...``)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def reason(fail: BaseFail) -> str:
    """The one line that says why a task failed: the stage's own message (mnnbuild's errors are one line), or the
    last line of an unexpected exception's traceback (shown above it in full: that is a bug)."""
    text = fail.get_msg().strip()
    if isinstance(fail, TaskError) and not isinstance(fail, TaskFailed):
        text = text.splitlines()[-1] if text else type(fail).__name__
    return " ".join(text.split()) or fail.get_name()


def file_to_read(task: Any, why: str) -> Path | None:
    """The file that says more about a failure: verify's report when the failure left it (no manifest beside it: one
    there is a past success's, whose report says PASSED), or the first existing file the message names."""
    for target in task.targets:
        text = Path(target).parent / VERIFY_REPORT_TEXT
        if text.is_file() and not Path(target).exists():
            return text
    for match in _PATH.findall(why):
        if Path(match).is_file():
            return Path(match)
    return None


class BuildSummaryReporter(ConsoleReporter):
    """doit's console output, ending with the build's outcome and next steps (see the module's doc); restores are
    counted per cache tier, with their files or without."""

    desc = "console output ending with what was built and what to do next"

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self.started = time.monotonic()
        self.built: list[str] = []
        self.restored: list[str] = []
        self.up_to_date: list[str] = []
        self.failed: list[tuple[Any, BaseFail]] = []
        self.running: set[str] = set()
        self.by_tier: dict[str, list[str]] = {}
        self.deferred: list[str] = []
        """Restored without their bytes (a remote tier's, fetched when read)."""
        self.bytes_restored: dict[str, int] = {}
        self.bytes_fetched: dict[str, int] = {}
        self.bytes_stored: dict[str, int] = {}
        self.bundles: dict[str, Path] = {}
        self.reports: dict[str, Path] = {}
        self.partitions: dict[str, Path] = {}
        self.state_dir: Path | None = None

    def initialize(self, tasks: dict[str, Any], selected_tasks: list[str]) -> None:
        super().initialize(tasks, selected_tasks)
        self.started = time.monotonic()

    def execute_task(self, task: Any) -> None:
        super().execute_task(task)
        self.running.add(task.name)

    def _seen(self, task: Any) -> None:
        self.running.discard(task.name)
        stage = task.name.split(":", 1)[0]
        if stage in ("bundle", "report") and task.targets and ":" in task.name:
            where = self.bundles if stage == "bundle" else self.reports
            where[task.name] = Path(task.targets[0]).parent
        if stage == "partition" and task.targets and ":" in task.name:
            self.partitions[task.name] = Path(task.targets[0]).parent

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        self._seen(task)
        values = task.values
        origin = values.get("origin")
        if origin == "cache":
            tier = str(values.get("tier", "local"))
            self.restored.append(task.name)
            self.by_tier.setdefault(tier, []).append(task.name)
            if values.get("deferred"):
                self.deferred.append(task.name)
            _add(self.bytes_restored, {tier: values.get("bytes", 0)})
        elif origin == "built":
            self.built.append(task.name)
            stored = values.get("stored")
            _add(self.bytes_stored, stored if isinstance(stored, dict) else {"local": values.get("bytes", 0)})
            fetched = values.get("fetched")
            _add(self.bytes_fetched, fetched if isinstance(fetched, dict) else {})
        elif origin == "recorded":  # doit had lost its state; the stage dir's own records proved it up to date
            self.up_to_date.append(task.name)

    def add_failure(self, task: Any, fail: BaseFail) -> None:
        self.running.discard(task.name)
        if not fail.report:
            return
        self.failed.append((task, fail))
        if isinstance(fail, TaskError) and not isinstance(fail, TaskFailed):  # a bug: its traceback, now
            self.write(f"{fail.get_name()} - taskid:{task.name}\n{fail.get_msg()}\n")

    def skip_uptodate(self, task: Any) -> None:
        if not task.actions:  # a group: its members had their lines
            return
        super().skip_uptodate(task)
        self._seen(task)
        if not task.name.startswith("_"):
            self.up_to_date.append(task.name)

    def complete_run(self) -> None:
        # doit calls this in a `finally`: a Ctrl-C or SIGTERM on its way out is the exception being handled
        stop = sys.exc_info()[1]
        seconds = time.monotonic() - self.started
        stopped = (str(stop) or "stopped by Ctrl-C") if isinstance(stop, KeyboardInterrupt) else None
        if self.running and stopped is None:
            stopped = "stopped"
        self._write_record(seconds, stopped)  # on every ending: a script must not read the last run's record
        if self.running:  # stopped (Ctrl-C, SIGTERM) inside a task: the interrupt handler says so, in one line
            return
        for task, _ in self.failed:
            self._write_task_output(task)
        lines = self._outcome(seconds) + self._partition_lines()
        lines += self._failures() if self.failed else self._next_steps()
        if self.runtime_errors:
            lines += ["doit: " + " ".join(e.split()) for e in self.runtime_errors]
        if lines:
            self.write("\n".join(lines) + "\n")

    # -- the ending --------------------------------------------------------------------------------------------

    def _outcome(self, seconds: float) -> list[str]:
        ran = len(self.built) + len(self.restored) + len(self.up_to_date) + len(self.failed)
        if not ran:
            return []
        parts = [f"{len(self.built)} built"]
        if self.restored:
            moved = human_bytes(sum(self.bytes_restored.values()) + sum(self.bytes_fetched.values()))
            tiers = ", ".join(f"{tier} {len(names)}" for tier, names in sorted(self.by_tier.items()))
            parts.append(f"{len(self.restored)} restored from the cache ({tiers}; {moved})")
        parts.append(f"{len(self.up_to_date)} up to date")
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        return [f"{'failed' if self.failed else 'done'} in {seconds:.1f} s: {', '.join(parts)}"]

    def _partition_lines(self) -> list[str]:
        """What runs where, per partition the run touched: plugins and the CPU's share of the weights."""
        lines = []
        for task, where in list(self.partitions.items())[:_SHOWN]:
            try:
                report = PartitionReport.model_validate_json(
                    (where / PARTITION_REPORT_JSON).read_text(encoding="utf-8")
                )
            except (OSError, ValueError):
                continue
            lines.append(f"{task.replace(':', ' ', 1)}: {report.cpu_summary()}")
        return lines

    def _next_steps(self) -> list[str]:
        lines = []
        here: list[Path] = []  # bundles whose files are in their dir (a cache hit nothing read leaves them out)
        for task, bundle in list(self.bundles.items())[:_SHOWN]:
            try:
                outputs = BundleManifest.read(bundle).outputs
            except MnnbuildError:
                lines.append(f"bundle  {shown(bundle)}")
                continue
            size = f"{len(outputs)} files, {human_bytes(sum(r.size for r in outputs))}"
            if all((bundle / r.path).is_file() for r in outputs):
                lines.append(f"bundle  {shown(bundle)} ({size})")
                here.append(bundle)
            else:
                lines.append(f"bundle  {shown(bundle)}: in the cache ({size}); `doit {task}` writes it here")
        for report in list(self.reports.values())[:_SHOWN]:
            if (report / REPORT_PAGE).is_file():
                lines.append(f"report  {(report / REPORT_PAGE).resolve().as_uri()}")
        for bundle in here:
            push = shown(bundle / PUSH_SCRIPT)
            lines.append(f"push    QNN_SDK_ROOT=<QAIRT SDK> MNN_BUILD_DIR=<llm_demo build> {push}")
        if here:
            lines.append(f"        then {RUN_SCRIPT} beside it runs the prompt on the phone")
        more = len(self.bundles) - _SHOWN
        if more > 0:
            lines.append(f"        (+{more} more bundles: {shown(self._record_path() or Path(LAST_RUN))})")
        return lines

    def _failures(self) -> list[str]:
        lines = []
        for task, fail in self.failed:
            why = reason(fail)
            lines += [f"failed  {task.name}:", why]  # the reason as the stage wrote it, on a line of its own
            read = file_to_read(task, why)
            if read is not None:
                lines.append(f"read    {shown(read)}")
        lines.append("fix it and run the same command again: what finished is kept")
        return lines

    def _write_task_output(self, task: Any) -> None:
        """What a failed task printed that doit captured (its stdout at the default verbosity), if anything."""
        if not task.executed:
            return
        out = "".join(a.out for a in task.actions if a.out).strip()
        err = "".join(a.err for a in task.actions if a.err).strip() if task.verbosity < 1 else ""
        for label, text in (("stdout", out), ("stderr", err)):
            if text:
                self.write(f"{task.name} <{label}>:\n{text}\n")

    # -- the record ----------------------------------------------------------------------------------------------

    def _record_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / LAST_RUN

    def _write_record(self, seconds: float, stopped: str | None = None) -> None:
        """``stopped``: how the run was interrupted (None: it ran to its end); ``running`` then names the tasks it
        stopped in, which finished nothing."""
        path = self._record_path()
        if path is None:
            return
        record = {
            "seconds": round(seconds, 3),
            "interrupted": stopped,
            "running": sorted(self.running),
            "built": self.built,
            "from_cache": self.restored,
            "up_to_date": self.up_to_date,
            "failed": {task.name: reason(fail) for task, fail in self.failed},
            "by_tier": self.by_tier,
            "no_bytes": self.deferred,
            "bytes_restored": self.bytes_restored,
            "bytes_fetched": self.bytes_fetched,
            "bytes_stored": self.bytes_stored,
            "bundles": {name: str(d) for name, d in self.bundles.items()},
            "reports": {name: str(d / REPORT_PAGE) for name, d in self.reports.items()},
        }
        try:
            atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        except OSError:  # the record is for scripts; the run's result stands without it
            pass


def reporter_for(artifact_root: Path) -> type[BuildSummaryReporter]:
    """The reporter class doit instantiates (it takes a class), writing its record under ``artifact_root``."""

    class Reporter(BuildSummaryReporter):
        def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
            super().__init__(outstream, options)
            self.state_dir = Path(artifact_root)

    return Reporter


def _add(totals: dict[str, int], more: dict[str, Any]) -> None:
    for tier, n in more.items():
        totals[str(tier)] = totals.get(str(tier), 0) + int(n or 0)


__all__ = ["LAST_RUN", "BuildSummaryReporter", "reporter_for"]
