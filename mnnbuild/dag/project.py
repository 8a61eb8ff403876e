"""The project a DAG is declared from: specs, settings, and doit's configuration."""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doit.cmd_base import DodoTaskLoader
from doit.cmdparse import CmdOption, CmdParse, CmdParseError
from doit.dependency import MD5Checker
from doit.exceptions import InvalidDodoFile

from mnnbuild.base import logs
from mnnbuild.base.errors import MnnbuildError, SpecError
from mnnbuild.base.fsutil import KnownHashes, parse_json
from mnnbuild.base.userdirs import user_cache_dir
from mnnbuild.dag.reporter import reporter_for
from mnnbuild.dag.status import MnnbuildDoit
from mnnbuild.pipeline.cache import local_cache_dir
from mnnbuild.pipeline.chain import Chain
from mnnbuild.pipeline.fingerprint import DigestMemo
from mnnbuild.pipeline.layout import CODE_DIGESTS
from mnnbuild.pipeline.models import Model
from mnnbuild.pipeline.settings import Settings

log = logging.getLogger(__name__)

DOIT_STATE = ".doit.db"
"""doit's state file, under the artifact root (sqlite3)."""

# What a bare `doit` builds: the shipped tiny model, so a fresh clone proves the whole chain.
DEFAULT_MODEL = "tiny-qwen3"


def configure_logging() -> None:
    """mnnbuild's logging for a doit run (``MNNBUILD_LOG_LEVEL``); a value that is no level is one line, for every
    doit command (doit prints InvalidDodoFile so, instead of a traceback)."""
    try:
        logs.configure_logging()
    except MnnbuildError as exc:
        raise InvalidDodoFile(str(exc)) from None


@dataclass(frozen=True)
class Project:
    """The specs and settings every task is declared from."""

    settings: Settings
    specs: Mapping[str, Model]
    memo: DigestMemo
    chain: Chain
    """The stages tasks are declared for (dodo.py passes `mnnbuild.stages.chain.CHAIN`)."""
    requested: tuple[str, ...] = ()
    """The tasks the command line names (`requested_tasks`): their outputs are restored with their files."""
    hashes: KnownHashes = field(default_factory=KnownHashes, compare=False)
    """The files this run hashed (doit's file checks, task keys, the stages' records): each hashed once."""
    runs: dict[Path, dict[str, Any]] = field(default_factory=dict, compare=False)
    """The `run_stage` arguments of the tasks declared so far whose dirs a cache hit may leave without their files,
    by dir: a task that reads such a dir and cannot fetch its files builds it again with them
    (`mnnbuild.dag.actions.build_again`)."""

    @classmethod
    def load(cls, project_root: Path, chain: Chain, argv: Sequence[str] = ()) -> Project:
        """The project of ``chain``'s models (`Chain.models`) found in the spec dirs of the settings."""
        if chain.models is None:
            raise ValueError("the chain declares no models (Chain(stages, models=...)) to declare tasks for")
        requested = requested_tasks(argv)
        try:
            settings = Settings.from_env(project_root)
            bad: dict[Path, SpecError] = {}
            specs = chain.models.discover(list(settings.spec_dirs), bad)
            for path, exc in bad.items():  # named and left out, unless the command asks for that model
                if _asks_for(path, chain.models.declared_name, requested, doit_runs_tasks(argv)):
                    raise exc
                log.warning("%s (its model's tasks are left out)", exc)
            settings.check_artifact_root(s.local_dir() for s in specs.values() if s.source.kind == "local")
        except MnnbuildError as exc:
            # doit prints InvalidDodoFile as one clean line instead of a traceback
            raise InvalidDodoFile(str(exc)) from None
        # keyed by content, the memo serves every artifact root and clone: beside a local cache, or (cache off or
        # remote) in the user cache dir, so a fresh artifact root does not parse all our sources again
        memo_dir = local_cache_dir(os.environ) or user_cache_dir(os.environ)
        memo = DigestMemo(memo_dir / CODE_DIGESTS)
        return cls(settings=settings, specs=specs, memo=memo, chain=chain, requested=requested)

    def wants(self, task: str) -> bool:
        """Whether the command line asks for ``task`` itself: by its name, or by a group it belongs to (``bundle``,
        ``twin:<model>-<arch>``)."""
        return any(task == name or task.startswith(f"{name}:") for name in self.requested)

    def stage_dir(self, stage: str, spec: Model, arch: str | None = None, part: str | None = None) -> Path:
        """Where ``stage`` writes for ``spec`` (and ``arch``, for the per-target stages; ``part``: a VL model's
        ``visual`` part)."""
        return self.chain.stage_dir(self.settings.artifact_root, stage, spec.name, arch, part)

    def default_tasks(self) -> list[str]:
        # verifying a bundle builds it first, so a bare `doit` builds, proves and reports the default model
        spec = self.specs.get(DEFAULT_MODEL)
        if spec is None:
            return []
        default = [s.name for s in self.chain if s.default]
        return [f"{stage}:{spec.name}-{arch}" for arch in spec.targets for stage in default]

    def doit_config(self) -> dict[str, Any]:
        """DOIT_CONFIG: state under the artifact root, subtasks listed, every failure reported."""
        root = self.settings.artifact_root
        try:  # doit's state lives here: an unwritable root is one line, not a sqlite traceback
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=root):
                pass
        except OSError as exc:
            raise InvalidDodoFile(
                f"{root}: the artifact root is not writable ({exc.strerror}); set MNNBUILD_ARTIFACTS to a writable "
                "directory"
            ) from None
        state = root / DOIT_STATE
        if state.exists() and not state.is_file():  # not doit's file: nothing mnnbuild made, so not moved aside
            kind = "a directory" if state.is_dir() else "not a regular file"
            raise InvalidDodoFile(
                f"{state}: doit's state file is {kind}; expected the sqlite file doit writes there (move it away, or "
                "set MNNBUILD_ARTIFACTS to another artifact root)"
            )
        set_aside_corrupt_state(state)
        return {
            "dep_file": str(state),
            "backend": "sqlite3",
            "check_file_uptodate": content_checker(self.hashes),
            "subtasks": True,
            "default_tasks": self.default_tasks(),
            "verbosity": 1,
            "reporter": reporter_for(root, self.chain),
        }


def content_checker(hashes: KnownHashes) -> type[MD5Checker]:
    """doit's file_dep check as its md5 one does it (the mtime it had, else the size and the content), the content
    by sha256 through ``hashes``: a model's weight file, which its fetch and the task key hash too, is hashed once (and
    sha256 reads faster than doit's md5, which reads 8 KB at a time)."""

    class ContentChecker(MD5Checker):
        def check_modified(self, file_path: str, file_stat: os.stat_result, state: Any) -> bool:
            timestamp, size, digest = state
            if file_stat.st_mtime == timestamp:
                return False
            return file_stat.st_size != size or digest != hashes.sha256(Path(file_path))

        def get_state(self, dep: str, current_state: Any) -> tuple[float, int, str] | None:
            timestamp = os.path.getmtime(dep)
            if current_state and current_state[0] == timestamp:
                return None
            return timestamp, os.path.getsize(dep), hashes.sha256(Path(dep))

    return ContentChecker


def _asks_for(
    spec_path: Path, declared_name: Callable[[Path], str | None], requested: Sequence[str], runs: bool
) -> bool:
    """Whether a command that runs tasks asks for the model of a spec that did not load: a task of it by name (the
    spec's ``name`` if it reads, else its file's stem), a whole stage (every model's), or a bare `doit` when it is
    the default model."""
    if not runs:
        return False
    names = {spec_path.stem, declared_name(spec_path)} - {None}
    if not requested:
        return DEFAULT_MODEL in names
    for task in requested:
        model = task.split(":")[1] if ":" in task else None
        if model is None or any(model == n or re.fullmatch(rf"{re.escape(n)}-[^-]+", model) for n in names):
            return True
    return False


def doit_runs_tasks(argv: Sequence[str]) -> bool:
    """Whether the doit command line ``argv`` (its arguments) runs tasks, by doit's own account of its commands
    (``run``, the default, does; ``list``, ``clean``, ``info``, ``forget`` ... only read the task list). Parsed
    the way doit parses it: loader options (``-f FILE``) may come first, ``name=value`` arguments are variables.
    A command doit does not define here (a plugin's) counts as running tasks.
    """
    try:
        _, rest = CmdParse([CmdOption(opt) for opt in DodoTaskLoader.cmd_options]).parse_only(list(argv))
    except CmdParseError:
        rest = list(argv)
    rest = [arg for arg in rest if arg.startswith("-") or "=" not in arg]
    commands = {cmd.get_name(): cmd for cmd in MnnbuildDoit.DOIT_CMDS}
    # the first word that is no option (``python -m mnnbuild -v status`` loads dodo.py with mnnbuild's argv)
    command = commands.get(next((arg for arg in rest if not arg.startswith("-")), ""))
    return command is None or bool(command.execute_tasks)


def requested_tasks(argv: Sequence[str]) -> tuple[str, ...]:
    """The task names a doit command line ``argv`` that runs tasks gives (none for ``list``, ``clean`` ... or a bare
    ``doit``, whose default tasks are verify and report): its positional arguments after doit's options."""
    if not doit_runs_tasks(argv):
        return ()
    commands = {cmd.get_name(): cmd for cmd in MnnbuildDoit.DOIT_CMDS}

    def parse(args: list[str], command: str) -> list[str]:
        """``args`` after the loader's options (``-f FILE``) and ``command``'s, which may come in any order."""
        options = [*DodoTaskLoader.cmd_options, *commands[command].cmd_options]
        try:
            return list(CmdParse([CmdOption(opt) for opt in options]).parse_only(args)[1])
        except CmdParseError:
            return args

    rest = parse(list(argv), "run")  # `doit -f dodo.py -n 2 bundle:...`: run is the default command
    if rest and rest[0] in commands:
        rest = parse(rest[1:], rest[0])
    return tuple(arg for arg in rest if not arg.startswith("-") and "=" not in arg)


def set_aside_corrupt_state(path: Path) -> Path | None:
    """Move doit's state file aside when it is corrupt, so doit starts without state instead of a traceback.

    Losing the state is safe: a task without state runs again (or is restored from the cache), and every task's
    outputs are checked against its manifest anyway. Returns where the file went (None: it was fine or absent).
    """
    problem = _state_problem(path)
    if problem is None:
        return None
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-journal", "-wal", "-shm"):  # sqlite's side files belong to the file they were written for
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, f"{aside}{suffix}")
    log.warning("%s: doit's state file is corrupt (%s); moved it to %s, starting without state", path, problem, aside)
    return aside


def _state_problem(path: Path) -> str | None:
    """What is wrong with doit's sqlite state file ``path``, or None when it is sound, absent or busy."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(path, timeout=5)
    except sqlite3.Error:
        return None
    try:
        check = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if check != ["ok"]:
            return f"sqlite quick_check: {'; '.join(map(str, check[:3]))}"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "doit" not in tables:
            return None  # doit creates its table
        for task, data in conn.execute("SELECT task_id, task_data FROM doit"):
            try:
                if not isinstance(parse_json(data), dict):
                    return f"the state of task {task!r} is not a JSON object"
            except (TypeError, ValueError):
                return f"the state of task {task!r} is not JSON"
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorname", "")
        corrupt = code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "not a database" in str(exc)
        return str(exc) if corrupt or "malformed" in str(exc) else None  # busy, locked, I/O: not ours to judge
    finally:
        conn.close()
    return None
