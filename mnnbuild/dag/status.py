"""Why a task would run, in words: ``python -m mnnbuild status [TASK...]`` (what ``dvc status`` is to dvc).

doit keeps, per task, the state of its last success in ``.doit.db``: its file_dep's hashes, the whole task key
(``config_changed`` stores the key string: code, schema, what it builds, params, tools) and what the checkers of
`mnnbuild.dag.uptodate` saved. `explain` compares those with the task as declared now and names what differs: an
input file (path), a parameter (old -> new), code (the modules, from `code_record`), a tool version, an output
missing or edited. Group tasks (no actions) are up to date when every task they stand for is (`members_up_to_date`),
so ``doit list --status`` shows them truthfully.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from doit.cmd_base import DoitCmdBase
from doit.control import TaskControl
from doit.dependency import UptodateCalculator
from doit.doit_cmd import DoitMain
from doit.tools import config_changed

from mnnbuild.dag.reporter import shown
from mnnbuild.dag.uptodate import files_unchanged, hf_pinned, origin_matches, outputs_intact
from mnnbuild.pipeline.fingerprint import DigestMemo, module_digests

CODE_RECORD = "_code_modules"
"""The value `code_record` saves in doit's state: the code digest of each module a stage's key covers."""


class code_record:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate that decides nothing (None): it saves the digest of each module a stage's code fingerprint
    covers, so `explain` can name the modules that changed (the key holds only their combined digest)."""

    def __init__(self, module: str, memo: DigestMemo | None = None) -> None:
        self.modules = {name: digest[:16] for name, digest in module_digests(module, memo).items()}

    def configure_task(self, task: Any) -> None:
        task.value_savers.append(lambda: {CODE_RECORD: self.modules})

    def __call__(self) -> None:
        return None


class members_up_to_date(UptodateCalculator):  # noqa: N801 - a doit uptodate checker
    """doit uptodate of a group task (no actions of its own): up to date when every task it depends on is. Without
    it doit counts a group as never up to date ("R" in ``doit list --status``, a task that would do nothing)."""

    def setup(self, dep_manager: Any, tasks_dict: dict[str, Any]) -> None:
        super().setup(dep_manager, tasks_dict)
        self.dep_manager = dep_manager

    def __getstate__(self) -> dict[str, Any]:  # `doit -n` pickles tasks; the state file's handle stays here
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        for name in task.task_dep:
            member = self.tasks_dict.get(name)
            if member is None or member.loader is not None:  # not created yet (after its partition)
                return False
            if self.dep_manager.get_status(member, self.tasks_dict).status != "up-to-date":
                return False
        return True


def group(task: dict[str, Any]) -> dict[str, Any]:
    """``task`` (a group: no actions, task_dep) with `members_up_to_date` as its up-to-date check."""
    return {**task, "uptodate": [members_up_to_date()]}


# -- explaining ---------------------------------------------------------------------------------------------------


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a.b`` -> leaf value (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    found: dict[str, Any] = {}
    for k, v in value.items():
        found.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return found


def _changes(kind: str, old: Any, new: Any) -> list[str]:
    old_flat, new_flat = _flat(old), _flat(new)
    lines = []
    for name in sorted(old_flat.keys() | new_flat.keys()):
        before, after = old_flat.get(name, "(none)"), new_flat.get(name, "(none)")
        if before != after:
            lines.append(f"{kind} {name}: {json.dumps(before)} -> {json.dumps(after)}")
    return lines


def _key_changes(old_key: str, new_key: str, old_modules: Any, new_modules: dict[str, str]) -> list[str]:
    """What differs between the task key on record and the one declared now."""
    try:
        old, new = json.loads(old_key), json.loads(new_key)
    except ValueError:
        return ["task key changed"]
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["task key changed"]
    lines = []
    if old.get("code") != new.get("code"):
        if isinstance(old_modules, dict):
            changed = sorted(m for m in new_modules if m in old_modules and old_modules[m] != new_modules[m])
            added = sorted(new_modules.keys() - old_modules.keys())
            removed = sorted(old_modules.keys() - new_modules.keys())
            lines += [f"code changed: {m}" for m in changed]
            lines += [f"code added: {m} (now imported)" for m in added]
            lines += [f"code removed: {m} (no longer imported)" for m in removed]
        if not lines:
            lines.append("code changed (the stage's module or one it imports; no per-module record of the last run)")
    if old.get("schema") != new.get("schema"):
        lines.append("manifest schema changed")
    lines += _changes("builds", old.get("inputs"), new.get("inputs"))
    lines += _changes("param", old.get("params"), new.get("params"))
    lines += _changes("tool", old.get("tools"), new.get("tools"))
    old_reads, new_reads = old.get("reads") or {}, new.get("reads") or {}
    if isinstance(old_reads, dict) and isinstance(new_reads, dict):
        for path in sorted(old_reads.keys() | new_reads.keys()):
            if path not in old_reads or path not in new_reads:
                lines.append(f"input {'added' if path in new_reads else 'removed'}: {path}")
            elif old_reads[path] != new_reads[path]:
                lines.append(f"input changed: {path} (by its manifest's record)")
    return lines or ["task key changed"]


def _checker_reasons(task: Any, checker: Any, values: dict[str, Any]) -> list[str]:
    """Why one of a task's up-to-date checks said no, in words."""
    if isinstance(checker, config_changed):
        modules = next((u.modules for u, _, _ in task.uptodate if isinstance(u, code_record)), {})
        return _key_changes(str(values.get("_config_changed")), str(checker.config), values.get(CODE_RECORD), modules)
    if isinstance(checker, outputs_intact):
        known = values.get(f"outputs_intact:{checker.out_dir}")
        return [_short_output(checker.out_dir, p) for p in checker.problems(known if isinstance(known, dict) else None)]
    if isinstance(checker, files_unchanged):
        return checker.changes(values.get(f"files_unchanged:{checker.root}"))
    if isinstance(checker, origin_matches):
        return [f"{shown(checker.path.parent)} holds another task's outputs, or none (its origin record says so)"]
    if getattr(checker, "__qualname__", "").startswith(f"{hf_pinned.__name__}."):
        return ["the lock file pins another commit than the one fetched"]
    if checker is False:
        return ["runs whenever asked (no up-to-date check)"]
    if isinstance(checker, members_up_to_date):
        return []  # a group: its members say why
    return [f"up-to-date check {type(checker).__name__} says no"]


def _short_output(out_dir: Path, problem: str) -> str:
    what, _, rel = problem.partition(": ")
    return f"{what}: {shown(Path(out_dir) / rel)}" if rel and not what.startswith("manifest") else problem


def explain(task: Any, tasks: dict[str, Any], dep_manager: Any, producers: dict[str, str]) -> list[str]:
    """Why ``task`` would run (nothing: it is up to date); ``producers`` maps a target to the task making it."""
    status = dep_manager.get_status(task, tasks, get_log=True)
    if status.status == "up-to-date":
        return []
    values = dep_manager.get_values(task.name)
    reasons = status.reasons
    if (
        task.actions
        and "_config_changed" not in values
        and any(isinstance(u, config_changed) for u, _, _ in task.uptodate)
    ):
        return ["never built here (no record in .doit.db)"]
    lines: list[str] = []
    failed = [checker for checker, _, _ in reasons.get("uptodate_false", [])]
    if any(isinstance(c, config_changed) for c in failed):  # a new key is a new identity: that says it already
        failed = [c for c in failed if not isinstance(c, origin_matches)]
    for dep in reasons.get("missing_file_dep", []):
        lines.append(f"input missing: {shown(dep)}" + (f" (made by {producers[dep]})" if dep in producers else ""))
    for dep in reasons.get("changed_file_dep", []):
        lines.append(f"input changed: {shown(dep)}" + (f" (made by {producers[dep]})" if dep in producers else ""))
    for dep in reasons.get("added_file_dep", []):
        lines.append(f"input added: {shown(dep)}")
    for dep in reasons.get("removed_file_dep", []):
        lines.append(f"input removed: {shown(dep)}")
    for checker in failed:  # after the inputs: a changed input is the cause of what follows from it
        lines += _checker_reasons(task, checker, values)
    for target in reasons.get("missing_target", []):
        lines.append(f"output missing: {shown(target)}")
    if reasons.get("checker_changed"):
        lines.append("doit's file checker changed since the last run")
    if reasons.get("has_no_dependencies") and task.actions:
        lines.append("runs whenever asked (no dependencies)")
    return lines


def _closure(names: Iterable[str], tasks: dict[str, Any], producers: dict[str, str]) -> list[str]:
    """``names`` and every task they depend on (task_dep, and the makers of their file_dep), dependencies first."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in tasks:
            return
        seen.add(name)
        task = tasks[name]
        for dep in [*task.task_dep, *task.setup_tasks, *(producers[f] for f in task.file_dep if f in producers)]:
            visit(dep)
        order.append(name)

    for name in names:
        visit(name)
    return order


def status_lines(tasks: dict[str, Any], selected: list[str], dep_manager: Any) -> Iterator[str]:
    """The report of `Status`: each task that would run with its reasons, then those that run only if an upstream
    task's outputs come out different."""
    producers = {t: name for name, task in tasks.items() for t in task.targets}
    names = _closure(selected, tasks, producers)
    stale: set[str] = set()
    maybe: list[str] = []
    later: list[str] = []
    for name in names:
        task = tasks[name]
        if task.loader is not None:  # a placeholder of tasks created after a partition
            later.append(name)
            continue
        lines = explain(task, tasks, dep_manager, producers)
        upstream = {producers[f] for f in task.file_dep if f in producers} | set(task.task_dep)
        if not lines:
            if upstream & (stale | set(maybe)) and task.actions:
                maybe.append(name)
            continue
        stale.add(name)
        if not task.actions:
            continue  # a group: its members are listed
        yield name
        yield from (f"    {line}" for line in lines)
    if maybe:
        yield f"then, if what they make comes out different: {', '.join(maybe)}"
    if later:
        yield f"created once their model's partition ran: {', '.join(later)}"
    if not stale and not later:
        yield f"up to date: {sum(1 for n in names if tasks[n].actions)} tasks, nothing would run"


class Status(DoitCmdBase):
    """``status [TASK...]``: why each task would run (default: what a bare ``doit`` runs)."""

    name = "status"
    doc_purpose = "say why each task would run: which input, parameter, code, tool or output changed"
    doc_usage = "[TASK ...]"
    doc_description = None
    execute_tasks = False
    cmd_options = ()

    def _execute(self, pos_args: list[str] | None = None) -> int:
        control = TaskControl(self.task_list)
        selected = list(self.sel_tasks or control.tasks)
        unknown = [n for n in selected if n not in control.tasks]
        if unknown:
            sys.stderr.write(f"status: no task {unknown[0]!r}; `doit list --all` lists them\n")
            return 3
        for line in status_lines(control.tasks, selected, self.dep_manager):
            self.outstream.write(line + "\n")
        return 0


class MnnbuildDoit(DoitMain):
    """doit with mnnbuild's own commands (``status``)."""

    DOIT_CMDS = (*DoitMain.DOIT_CMDS, Status)


def run(dodo: Path, tasks: list[str]) -> int:
    """``python -m mnnbuild status [TASK...]`` on ``dodo``."""
    from doit.cmd_base import DodoTaskLoader

    return int(MnnbuildDoit(DodoTaskLoader()).run(["-f", str(dodo), "status", *tasks]))
