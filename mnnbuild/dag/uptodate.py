"""doit up-to-date checkers beyond file_dep and the task key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import MnnbuildError, UnsafePathError
from mnnbuild.base.fsutil import confined, file_stamp, parse_json, sha256_file
from mnnbuild.pipeline.deferred import deferred_origin
from mnnbuild.pipeline.layout import origin_file
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.origin import trusted_hashes


def hf_pinned(pinned: Callable[[Path, Path], bool], lock_path: Path, out_dir: Path) -> Callable[[], bool]:
    """Up to date while the fetched commit is still the one the lock file pins (`Stage.pinned`)."""

    def check() -> bool:
        return pinned(lock_path, out_dir)

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


def _same_stamped(path: Path, record: list[Any]) -> bool:
    """Whether ``path`` still holds the content of ``record`` (`files_unchanged.snapshot`: size, mtime, sha256, ctime,
    inode): an edit that puts the old size and mtime back moves the ctime, a replacement the inode; either is hashed.
    A record of three, [size, mtime, sha256] (written before the ctime and inode were kept), by size and mtime."""
    if len(record) == 3:
        return _same_content(path, *record)
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != record[0]:
        return False
    if [st.st_mtime_ns, st.st_ctime_ns, st.st_ino] == [record[1], record[3], record[4]]:
        return True
    return sha256_file(path) == record[2]


def _in_dir(base: Path, rel: str, links: bool) -> Path | None:
    """``base / rel`` for a path read from a manifest or doit's state, or None when it leads outside ``base``
    (``..``, absolute, through a symlink): checked before anything is stat'ed or hashed through it. ``links``: the
    file itself may be a symlink (fetch's outputs link to the model's files)."""
    try:
        return confined(base, rel, f"{base}", follow_last=not links)
    except UnsafePathError:
        return None


class outputs_intact:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: the stage's outputs are still what its manifest recorded (none deleted, edited or replaced).

    doit itself only checks that the target (the manifest) exists; an output deleted or edited later would
    otherwise pass as up to date and break the stages after it. An unreadable manifest is not up to date either,
    nor one listing a path outside the stage dir (never stat'ed or hashed). ``links``: outputs may be symlinks
    (fetch's, to the model's files); a link out of any other stage's dir is not its output.

    A dir restored without its files (`deferred_origin`) is intact, when ``deferred_ok``, while its manifest is the
    one restored (by sha256) and none of its outputs is there: they are in the cache, checked when fetched. Not
    ``deferred_ok`` (the task is asked for by name): it needs its files.
    """

    def __init__(self, out_dir: Path, manifest: type[Manifest], links: bool = False, deferred_ok: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.manifest = manifest
        self.links = links
        self.deferred_ok = deferred_ok

    def _mtimes(self) -> dict[str, int]:
        try:
            records = self.manifest.read(self.out_dir).outputs
        except MnnbuildError:
            return {}
        found = {}
        for rec in records:
            path = _in_dir(self.out_dir, rec.path, self.links)
            try:
                if path is not None:
                    found[rec.path] = path.stat().st_mtime_ns
            except OSError:
                continue
        return found

    def intact(self, known: dict[str, int] | None = None) -> bool:
        """Whether every output is there with its recorded content (size, then mtime as of ``known`` or the hash)."""
        try:
            records = self.manifest.read(self.out_dir).outputs
        except MnnbuildError:
            return False
        deferred = deferred_origin(self.out_dir, self.manifest.stage)
        left: set[str] = set()
        if deferred is not None:
            if not self.deferred_ok or not self._deferred_intact(records, deferred):
                return False
            left = set(deferred.get("deferred_files") or [r.path for r in records])
        known = known or {}
        trusted = self._trusted(records, known)
        for r in records:
            if r.path in left:
                continue  # in the cache, absent here (`_deferred_intact`)
            path = _in_dir(self.out_dir, r.path, self.links)
            if path is None or not self._unchanged(path, r, known, trusted):
                return False
        return True

    def _trusted(self, records: list[Any], known: dict[str, int]) -> dict[str, list[int]]:
        """The stamps the origin record took as it hashed the outputs, when some output has no mtime on doit's record
        (fetched from the cache, or built again by a task that read it, after its own task last ran)."""
        return trusted_hashes(self.out_dir, self.manifest.stage) if any(r.path not in known for r in records) else {}

    @staticmethod
    def _unchanged(path: Path, r: Any, known: dict[str, int], trusted: dict[str, list[int]]) -> bool:
        """Whether the output ``path`` of record ``r`` has its recorded content: the mtime doit recorded, else the stamp
        the origin record took when it was hashed (size, mtime, ctime, inode: as verify trusts them), else its hash."""
        if r.path not in known and trusted.get(r.path) is not None and trusted[r.path][0] == r.size:
            if file_stamp(path) == trusted[r.path]:
                return True
        return _same_content(path, r.size, known.get(r.path), r.sha256)

    def problems(self, known: dict[str, int] | None = None) -> list[str]:
        """What is not as the manifest recorded, in words (``output missing: qnn/graphllm0.bin``): why `intact` says
        no, for ``python -m mnnbuild status``."""
        if self.intact(known):
            return []
        try:
            records = self.manifest.read(self.out_dir).outputs
        except MnnbuildError as exc:
            return [f"manifest unreadable: {exc}"]
        left: set[str] = set()
        deferred = deferred_origin(self.out_dir, self.manifest.stage)
        if deferred is not None:
            if not self.deferred_ok:
                return ["restored without its files, which a task asked for by name needs"]
            if not self._deferred_intact(records, deferred):
                return ["not what the cache restored (its manifest or a left-out file changed)"]
            left = set(deferred.get("deferred_files") or [r.path for r in records])
        found = []
        for r in records:
            path = _in_dir(self.out_dir, r.path, self.links)
            if r.path in left:
                continue
            if path is None:
                found.append(f"output outside its stage dir: {r.path}")
            elif not (path.exists() or path.is_symlink()):
                found.append(f"output missing: {r.path}")
            elif not self._unchanged(path, r, known or {}, self._trusted(records, known or {})):
                found.append(f"output edited or replaced: {r.path}")
        return found or ["outputs not as recorded"]

    def _deferred_intact(self, records: list[Any], origin: dict[str, Any]) -> bool:
        try:
            manifest_sha = sha256_file(self.out_dir / self.manifest.filename())
        except OSError:
            return False
        if manifest_sha != origin.get("manifest_sha256"):
            return False
        left = set(origin.get("deferred_files") or [r.path for r in records])
        for r in records:
            path = _in_dir(self.out_dir, r.path, self.links)
            if r.path in left and (path is None or path.exists() or path.is_symlink()):
                return False  # a file the cache left out is here: not what it restored
        return True

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"outputs_intact:{self.out_dir}"
        task.value_savers.append(lambda: {key: self._mtimes()})
        known = values.get(key)
        return self.intact(known if isinstance(known, dict) else None)


class files_unchanged:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: every file under ``root`` has the content it had after the task's last success.

    For tasks whose file_dep are manifests but which must re-check the files themselves (verify: a bundle
    file replaced after bundling must not pass as verified). Each file's stamp first (size, mtime, ctime, inode, as
    when the task last succeeded, restored from the cache included); a file whose stamp moved is hashed, so a stage
    upstream that rewrote the same bytes does not force a re-run, and an edit that kept the size and put the mtime
    back (``touch -r``) moved the ctime, so it is hashed and caught. (A record written before the ctime and inode
    were kept, [size, mtime, sha256], is held to those.)

    ``made_by``: the stage dir ``root`` lies in and its manifest: a file with the stamp its origin record gave it
    when that stage hashed it (`mnnbuild.pipeline.origin.trusted_hashes`) takes the manifest's sha256, not hashed
    again on the first snapshot.
    """

    def __init__(self, root: Path, made_by: tuple[Path, type[Manifest]] | None = None) -> None:
        self.root = Path(root)
        self.made_by = made_by

    def _trusted(self) -> dict[str, tuple[list[int], str]]:
        """rel path under ``root`` -> (stamp, sha256) of the files the stage that made them hashed."""
        if self.made_by is None:
            return {}
        stage_dir, manifest = self.made_by
        try:
            records = {r.path: r.sha256 for r in manifest.read(stage_dir).outputs}
        except MnnbuildError:
            return {}
        prefix = self.root.relative_to(stage_dir).as_posix() + "/" if self.root != stage_dir else ""
        return {
            rel[len(prefix) :]: (stamp, records[rel])
            for rel, stamp in trusted_hashes(stage_dir, manifest.stage).items()
            if rel.startswith(prefix) and rel in records
        }

    def snapshot(self, previous: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
        """path -> [size, mtime_ns, sha256, ctime_ns, inode]; hashes only files whose stamp differs from
        ``previous``."""
        if not self.root.is_dir():
            return {}
        previous = previous or {}
        trusted = self._trusted() if not previous else {}
        found: dict[str, list[Any]] = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_symlink() or not p.is_file():
                continue  # a link is never hashed through: its presence alone makes the check fail (`present`)
            rel, st = p.relative_to(self.root).as_posix(), p.stat()
            old = previous.get(rel)
            now = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            same_stat = isinstance(old, list) and len(old) == 5 and [*old[:2], *old[3:]] == now
            if not same_stat and rel in trusted and trusted[rel][0] == now:
                old, same_stat = [st.st_size, st.st_mtime_ns, trusted[rel][1]], True
            sha = old[2] if same_stat else sha256_file(p)
            found[rel] = [st.st_size, st.st_mtime_ns, sha, st.st_ctime_ns, st.st_ino]
        return found

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"files_unchanged:{self.root}"
        known = values.get(key)
        task.value_savers.append(lambda: {key: self.snapshot(known if isinstance(known, dict) else None)})
        return not self.changes(known, first=True)

    def changes(self, known: Any, first: bool = False) -> list[str]:
        """What differs from ``known`` (the record of the last success), in words; ``first``: stop at the first."""
        if not isinstance(known, dict):
            return ["no record of the files it checked"]
        if not self.root.is_dir():  # absent then too (a stage restored without its files): nothing changed
            return [] if known == {} else [f"{self.root.name} missing"]
        present = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file() or p.is_symlink()}
        found = [f"{self.root.name} file added: {rel}" for rel in sorted(present - set(known))]
        found += [f"{self.root.name} file missing: {rel}" for rel in sorted(set(known) - present)]
        for rel, record in known.items():  # names from doit's state file: confined before they are stat'ed
            if (found and first) or rel not in present:
                continue
            path = _in_dir(self.root, rel, links=False)
            if path is None or not isinstance(record, list) or len(record) not in (3, 5):
                found.append(f"{self.root.name} file unreadable on record: {rel}")
            elif path.is_symlink() or not _same_stamped(path, record):
                found.append(f"{self.root.name} file edited or replaced: {rel}")
        return found[:1] if first else found


class origin_matches:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: the stage dir's origin record says this task made it (`mnnbuild.dag.actions.task_identity`).

    A plugin dir swapped with another (``twin/graphllm0`` <-> ``twin/graphllm1``) matches its own manifest, so
    `outputs_intact` passes it; its record names the other plugin's task, so it is built or restored again.
    (A class, not a closure: ``doit -n`` pickles the tasks created after the partition.)"""

    def __init__(self, out_dir: Path, stage: str, identity: str) -> None:
        self.path = Path(out_dir) / origin_file(stage)
        self.identity = identity

    def __call__(self) -> bool:
        try:
            origin = parse_json(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        return isinstance(origin, dict) and origin.get("task") == self.identity
