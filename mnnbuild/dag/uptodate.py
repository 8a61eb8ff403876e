"""doit up-to-date checkers beyond file_dep and the task key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mnnbuild.errors import MnnbuildError
from mnnbuild.fsutil import sha256_file
from mnnbuild.manifest import Manifest
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


def _same_content(path: Path, size: int, mtime_ns: int | None, sha256: str) -> bool:
    """Whether ``path`` still holds the recorded content: size and mtime are cheap; the hash settles a doubt
    (a rewrite with the same bytes, e.g. a stage that re-ran upstream, keeps it up to date)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != size:
        return False
    return st.st_mtime_ns == mtime_ns or sha256_file(path) == sha256


class outputs_intact:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: the stage's outputs are still what its manifest recorded (none deleted, edited or replaced).

    doit itself only checks that the target (the manifest) exists; an output deleted or edited later would
    otherwise pass as up to date and break the stages after it. An unreadable manifest is not up to date either.
    """

    def __init__(self, out_dir: Path, manifest: type[Manifest]) -> None:
        self.out_dir = Path(out_dir)
        self.manifest = manifest

    def _mtimes(self) -> dict[str, int]:
        try:
            records = self.manifest.read(self.out_dir).outputs
        except MnnbuildError:
            return {}
        found = {}
        for rec in records:
            try:
                found[rec.path] = (self.out_dir / rec.path).stat().st_mtime_ns
            except OSError:
                continue
        return found

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"outputs_intact:{self.out_dir}"
        task.value_savers.append(lambda: {key: self._mtimes()})
        try:
            records = self.manifest.read(self.out_dir).outputs
        except MnnbuildError:
            return False
        known = values.get(key) or {}
        return all(_same_content(self.out_dir / r.path, r.size, known.get(r.path), r.sha256) for r in records)


class files_unchanged:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: every file under ``root`` has the content it had after the task's last success.

    For tasks whose file_dep are manifests but which must re-check the files themselves (verify: a bundle
    file replaced after bundling must not pass as verified). Size and mtime first; a file whose mtime moved
    is hashed, so a stage upstream that rewrote the same bytes does not force a re-run.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def snapshot(self, previous: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
        """path -> [size, mtime_ns, sha256]; hashes only files whose size or mtime differ from ``previous``."""
        if not self.root.is_dir():
            return {}
        previous = previous or {}
        found: dict[str, list[Any]] = {}
        for p in sorted(self.root.rglob("*")):
            if not p.is_file():
                continue
            rel, st = p.relative_to(self.root).as_posix(), p.stat()
            old = previous.get(rel)
            same_stat = isinstance(old, list) and len(old) == 3 and old[:2] == [st.st_size, st.st_mtime_ns]
            found[rel] = [st.st_size, st.st_mtime_ns, old[2] if same_stat else sha256_file(p)]
        return found

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"files_unchanged:{self.root}"
        known = values.get(key)
        task.value_savers.append(lambda: {key: self.snapshot(known if isinstance(known, dict) else None)})
        if not isinstance(known, dict) or not self.root.is_dir():
            return False
        present = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file()}
        if present != set(known):
            return False
        return all(_same_content(self.root / rel, size, mtime, sha) for rel, (size, mtime, sha) in known.items())
