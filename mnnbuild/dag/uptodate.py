"""doit up-to-date checkers beyond file_dep and the task key."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mnnbuild.errors import MnnbuildError
from mnnbuild.manifests.fetch import FetchManifest, HfLock


def hf_pinned(lock_path: Path, out_dir: Path) -> Callable[[], bool]:
    """Up to date while the fetched commit is still the one the lock file pins."""

    def check() -> bool:
        try:
            lock = HfLock.model_validate_json(lock_path.read_text(encoding="utf-8"))
            return FetchManifest.read(out_dir).source.commit == lock.commit
        except (OSError, ValueError, MnnbuildError):
            return False

    return check


class files_unchanged:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: every file under ``root`` has the size and mtime it had after the task's last success.

    For tasks whose file_dep are manifests but which must re-check the files themselves (verify: a bundle
    file replaced after bundling must not pass as verified). Stats are cheap; the task hashes when it runs.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def snapshot(self) -> str:
        if not self.root.is_dir():
            return ""
        stats = sorted(
            (p.relative_to(self.root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        )
        return json.dumps(stats)

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"files_unchanged:{self.root}"
        task.value_savers.append(lambda: {key: self.snapshot()})
        return values.get(key) == self.snapshot()
