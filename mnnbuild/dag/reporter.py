"""doit's console output plus a closing build summary."""

from __future__ import annotations

from typing import Any

from doit.reporter import ConsoleReporter

from mnnbuild.pipeline.cache import human_bytes


class BuildSummaryReporter(ConsoleReporter):
    """doit's console output, plus a closing summary: which tasks were built, restored, up to date."""

    desc = "console output with a build summary (built / from cache / up to date)"

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self.built: list[str] = []
        self.restored: list[str] = []
        self.up_to_date: list[str] = []
        self.bytes_restored = 0
        self.bytes_stored = 0

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        origin = task.values.get("origin")
        if origin == "cache":
            self.restored.append(task.name)
            self.bytes_restored += int(task.values.get("bytes", 0))
        elif origin == "built":
            self.built.append(task.name)
            self.bytes_stored += int(task.values.get("bytes", 0))
        elif origin == "recorded":  # doit had lost its state; the stage dir's own records proved it up to date
            self.up_to_date.append(task.name)

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        if not task.name.startswith("_"):
            self.up_to_date.append(task.name)

    def complete_run(self) -> None:
        super().complete_run()
        if not (self.built or self.restored or self.up_to_date):
            return
        lines = [
            f"build summary: {len(self.built)} built, {len(self.restored)} from cache "
            f"({human_bytes(self.bytes_restored)}), {len(self.up_to_date)} up to date, "
            f"{human_bytes(self.bytes_stored)} stored in cache"
        ]
        for label, names in (("built", self.built), ("from cache", self.restored), ("up to date", self.up_to_date)):
            if names:
                lines.append(f"  {label + ':':12} {' '.join(names)}")
        self.outstream.write("\n".join(lines) + "\n")
