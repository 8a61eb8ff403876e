"""doit's console output plus a closing build summary."""

from __future__ import annotations

from typing import Any

from doit.reporter import ConsoleReporter

from mnnbuild.base.sizes import human_bytes


class BuildSummaryReporter(ConsoleReporter):
    """doit's console output, plus a closing summary: which tasks were built, restored (from which cache tier, with
    their files or without), up to date, and the bytes moved per tier."""

    desc = "console output with a build summary (built / from cache / up to date)"

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self.built: list[str] = []
        self.restored: list[str] = []
        self.up_to_date: list[str] = []
        self.by_tier: dict[str, list[str]] = {}
        self.deferred: list[str] = []
        self.bytes_restored: dict[str, int] = {}
        self.bytes_fetched: dict[str, int] = {}
        self.bytes_stored: dict[str, int] = {}

    def add_success(self, task: Any) -> None:
        super().add_success(task)
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

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        if not task.name.startswith("_"):
            self.up_to_date.append(task.name)

    def complete_run(self) -> None:
        super().complete_run()
        if not (self.built or self.restored or self.up_to_date):
            return
        restored = sum(self.bytes_restored.values()) + sum(self.bytes_fetched.values())
        lines = [
            f"build summary: {len(self.built)} built, {len(self.restored)} from cache "
            f"({human_bytes(restored)}), {len(self.up_to_date)} up to date, "
            f"{human_bytes(sum(self.bytes_stored.values()))} stored in cache"
        ]
        rows = [("built", self.built), ("from cache", self.restored)]
        rows += [(f"from {tier}", names) for tier, names in sorted(self.by_tier.items())]
        rows += [("no bytes", self.deferred), ("up to date", self.up_to_date)]
        for label, names in rows:
            if names:
                lines.append(f"  {label + ':':12} {' '.join(names)}")
        tiers = sorted(set(self.bytes_restored) | set(self.bytes_fetched) | set(self.bytes_stored))
        if tiers:
            moved = (
                f"{tier} {human_bytes(self.bytes_restored.get(tier, 0) + self.bytes_fetched.get(tier, 0))} in, "
                f"{human_bytes(self.bytes_stored.get(tier, 0))} out"
                for tier in tiers
            )
            lines.append(f"  {'moved:':12} {'; '.join(moved)}")
        self.outstream.write("\n".join(lines) + "\n")


def _add(totals: dict[str, int], more: dict[str, Any]) -> None:
    for tier, n in more.items():
        totals[str(tier)] = totals.get(str(tier), 0) + int(n or 0)
