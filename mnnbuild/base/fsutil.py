"""Content hashing and atomic outputs: a stage's output directory appears whole or not at all; reading the JSON
objects the build's inputs and records are."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from mnnbuild.base.errors import MnnbuildError, OutputError, UnsafePathError

log = logging.getLogger(__name__)

_CHUNK = 8 << 20
_RANGE = 64 << 20  # what one copy_file_range call copies: hashed while the next one copies


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content (symlinks followed)."""
    with open(path, "rb") as f:
        if hasattr(hashlib, "file_digest"):
            return hashlib.file_digest(f, "sha256").hexdigest()
        digest = hashlib.sha256()  # Python 3.10 has no file_digest: the same, in chunks
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()


def file_stamp(path: Path | int) -> list[int] | None:
    """What changes whenever a file's content may have: size, mtime, ctime and inode (a write, a replacement, a
    ``touch -d`` all move one of them); None when it cannot be stat'ed. ``path`` may be an open file descriptor."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def copy_content(src: Path, dst: Path) -> None:
    """Write a copy of ``src``'s content (symlinks followed) to a new file ``dst``, in the kernel: copy_file_range, a
    reflink where the file system shares blocks (btrfs, XFS); a plain copy where that is not supported."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        left = os.fstat(fin.fileno()).st_size
        try:
            while left > 0 and (n := os.copy_file_range(fin.fileno(), fout.fileno(), left)) > 0:
                left -= n
        except OSError:  # not supported here (old kernel, other file systems): a plain copy
            left = -1
    if left != 0:
        shutil.copyfile(src, dst)


def copy_hashed(src: Path, dst: Path) -> str:
    """`copy_content` to a new file ``dst``, returning the sha256 of what ``dst`` then holds: each range is hashed as
    read back from ``dst`` once written (from the page cache), in a thread beside the copy of the next one, so a copy
    takes about as long as hashing alone. Where the kernel cannot copy, ranges go through this process."""
    digest = hashlib.sha256()
    written: queue.Queue[int | None] = queue.Queue()
    failed: list[BaseException] = []

    def hash_written() -> None:
        with open(dst, "rb", buffering=0) as back:
            while (n := written.get()) is not None:
                try:
                    while n > 0 and not failed:
                        chunk = back.read(min(n, _CHUNK))
                        if not chunk:
                            raise OSError(f"{dst}: shorter than what was written to it")
                        digest.update(chunk)
                        n -= len(chunk)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                    failed.append(exc)

    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        hasher = threading.Thread(target=hash_written, name="copy-hash", daemon=True)
        hasher.start()
        try:
            kernel = True
            while not failed:
                try:
                    n = os.copy_file_range(fin.fileno(), fout.fileno(), _RANGE) if kernel else 0
                except OSError:
                    kernel, n = False, 0  # from here on through this process (file positions are where it stopped)
                if n == 0 and not kernel:
                    chunk = fin.read(_CHUNK)
                    n = len(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[fout.write(view) :]
                if n == 0:
                    break
                written.put(n)
        finally:
            written.put(None)
            hasher.join()
    if failed:
        raise failed[0]
    return digest.hexdigest()


_TICK_NS = 20_000_000
"""A file system's clock tick at most, where its times have sub-second digits: Linux stamps a write with a clock that
ticks every 1-10 ms (a jiffy)."""
_COARSE_TICK_NS = 2_000_000_000
"""Where its times are whole seconds (FAT, HFS+, ext3's small inodes): up to 2 s."""
_WAIT_FOR_TICK = 16 << 20
"""`hash_stamped` waits out the tick (at most 20 ms) for a file at least this big: hashing it again costs more."""


def settled(stamp: list[int], at_ns: int) -> bool:
    """Whether a file that had ``stamp`` at ``at_ns`` (``time.time_ns()``) cannot be written since without changing
    it. A write sets the mtime and the ctime to its time, rounded down to the file system's tick: that changes a stamp
    whose mtime differs from its ctime, or whose ctime was a tick old at ``at_ns``. A file changed in the last tick
    (git's "racily clean" files) could be written again in that tick, its stamp left as it was: not settled."""
    _, mtime, ctime, _ = stamp
    if not isinstance(mtime, int) or not isinstance(ctime, int):
        return False  # a stat without nanosecond times: nothing to tell writes apart by
    second = 1_000_000_000
    tick = _COARSE_TICK_NS if mtime % second == ctime % second == 0 else _TICK_NS
    return mtime != ctime or at_ns - ctime >= tick


def hash_stamped(path: Path) -> tuple[str, list[int] | None]:
    """The sha256 of ``path``'s content and the stamp (`file_stamp`) it had throughout the read, when that stamp
    proves the content later (`settled` before the read, the same after it), else None. A big file written in the
    last tick is first given the rest of it (at most 20 ms)."""
    at = time.time_ns()
    before = file_stamp(path)
    if before is not None and not settled(before, at) and before[0] >= _WAIT_FOR_TICK:
        wait = before[2] + _TICK_NS - at
        if 0 < wait <= _TICK_NS:
            time.sleep(wait / 1e9)
            at, before = time.time_ns(), file_stamp(path)
    digest = sha256_file(path)
    after = file_stamp(path)
    proven = before is not None and before == after and settled(before, at)
    return digest, after if proven else None


class KnownHashes:
    """The sha256 of files by the stamp they had while they were hashed, where it proves their content (`hash_stamped`):
    a file that still has that stamp is not hashed again. One build's (doit's file checks, task keys) share one: a
    model's weights are hashed once, not by each."""

    def __init__(self) -> None:
        self._by_stamp: dict[tuple[int, ...], str] = {}

    def add(self, stamp: list[int] | None, sha256: str) -> None:
        if stamp is not None:
            self._by_stamp[tuple(stamp)] = sha256

    def sha256(self, path: Path) -> str:
        """``path``'s sha256: known by its stamp now, or hashed (and remembered)."""
        stamp = file_stamp(path)
        known = self._by_stamp.get(tuple(stamp)) if stamp is not None else None
        if known is not None:
            return known
        digest, proven = hash_stamped(path)
        self.add(proven, digest)
        return digest


def sha256_bytes(*parts: bytes) -> str:
    """Hex sha256 of the concatenated ``parts`` (the one content hash of mnnbuild and its runtime)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Yield an empty temp directory next to ``out_dir``; on success it replaces ``out_dir``.

    On any exception the temp directory is removed and an existing ``out_dir`` is left as it
    was, so a failed or interrupted stage never leaves a half artifact under the final name. Only a directory
    mnnbuild made is ever replaced (`check_replaceable`): anything else at ``out_dir`` stops the stage before it
    runs. What a killed writer of ``out_dir`` left behind (``kill -9``: no exception ran) is removed
    first (`remove_stale_temps`).
    """
    out_dir = Path(out_dir)
    check_replaceable(out_dir)  # before the work, not after it
    tmp = temp_path(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out_dir)
        tmp.mkdir()
    except OSError as exc:
        raise _unwritable(out_dir, exc) from None
    try:
        yield tmp
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in _UNWRITABLE:
            raise _unwritable(out_dir, exc) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out_dir)


# -- temp names that say who made them ---------------------------------------------------------------
# A temp is named ``.<name>.<kind>-<pid>-<start>-<scope>-<random>``: the writing process (its pid and start
# time, so a reused pid is not mistaken for it) and the pid namespace it lives in (this boot of this machine,
# this container). A later writer of the same name removes temps whose process is gone; temps of another
# machine or container (an NFS artifact root) are left alone, since their process cannot be checked from here.

_TEMP_KINDS = ("tmp", "old")
_TEMP_OWNER = re.compile(r"^(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<start>\d+)-(?P<scope>[0-9a-f]{8})-[0-9a-f]{8}$")
_PROC = Path("/proc")


def process_start(pid: int) -> tuple[str, str] | None:
    """(start time in clock ticks since boot, state letter) of process ``pid`` from ``/proc``, or None where
    there is no ``/proc`` or no such process."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
        return fields[19], fields[0]
    except (OSError, IndexError):
        return None


@functools.cache
def _pid_scope() -> str:
    """Where pids mean something: this boot of this machine and this pid namespace (the host name without /proc)."""
    try:
        where = (_PROC / "sys/kernel/random/boot_id").read_text().strip() + os.readlink(_PROC / "self/ns/pid")
    except OSError:
        where = socket.gethostname()
    return sha256_bytes(where.encode())[:8]


def temp_path(path: Path, kind: str = "tmp") -> Path:
    """A fresh temp name next to ``path`` that names this process as its writer (see `remove_stale_temps`)."""
    assert kind in _TEMP_KINDS
    pid = os.getpid()
    started = process_start(pid)
    owner = f"{pid}-{started[0] if started else 0}-{_pid_scope()}"
    return path.parent / f".{path.name}.{kind}-{owner}-{uuid.uuid4().hex[:8]}"


def _owner_gone(pid: int, start: str, scope: str) -> bool:
    """Whether the process that made a temp is known to be gone (never True for one that may still run)."""
    if scope != _pid_scope():
        return False  # another machine, container or boot: nothing to check it against
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it runs, as another user
    now = process_start(pid)
    if now is None:
        return False  # it exists, and /proc says nothing more (no /proc, or hidden): assume it runs
    started, state = now
    return started != start or state in ("Z", "X")  # the pid was reused, or its process died (a zombie)


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temps of ``path`` (`staged_dir`, `replace_dir`, `atomic_write_bytes`) that a killed writer left
    behind: those whose process no longer runs. Temps of running processes and of other machines stay."""
    prefix = f".{Path(path).name}."
    try:
        names = [n for n in os.listdir(Path(path).parent) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        owner = _TEMP_OWNER.match(name[len(prefix) :])
        if owner is None or not _owner_gone(int(owner["pid"]), owner["start"], owner["scope"]):
            continue
        stale = Path(path).parent / name
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
        log.info("removed %s, left by process %s, which no longer runs", stale, owner["pid"])
        removed.append(stale)
    return removed


# errors that mean "this location cannot take the output" (not a bug, not bad input): one line, no traceback
_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


def _unwritable(out_dir: Path, exc: OSError) -> OutputError:
    where = exc.filename or out_dir
    return OutputError(f"{where}: cannot write the output ({exc.strerror or exc}); {out_dir} was left as it was")


def check_free_space(directory: Path, need: int) -> None:
    """Refuse up front to write ``need`` bytes where they do not fit, for writers (MNN's) that crash on a
    full disk instead of reporting it."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    if free < need:
        raise OutputError(
            f"{directory}: No space left on device: writing needs about {need / 1e6:.1f} MB, {free / 1e6:.1f} MB free"
        )


# -- replacing and removing only what mnnbuild made ---------------------------------------------------------
MANIFEST_SUFFIX = ".manifest.json"
ORIGIN_SUFFIX = ".origin.json"
"""What every stage dir holds once made: its manifest (``<stage>.manifest.json``) and, when the DAG made it, how
(``<stage>.origin.json``). One of them, as mnnbuild writes it, proves a directory is a stage dir of ours."""


def _stage_record(path: Path) -> bool:
    """Whether ``path`` is a manifest or origin record as mnnbuild writes them (a JSON object with its key field)."""
    field = "schema_version" if path.name.endswith(MANIFEST_SUFFIX) else "origin"
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > 64 << 20:
            return False
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and field in data


def made_by_mnnbuild(directory: Path) -> bool:
    """Whether ``directory`` is a stage dir mnnbuild made (a manifest or origin record in it) or an empty directory
    (nothing to lose). A symlink, a file or a directory of anything else is not."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return False
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return not names or any(
        n.endswith((MANIFEST_SUFFIX, ORIGIN_SUFFIX)) and _stage_record(directory / n) for n in names
    )


def check_replaceable(out_dir: Path) -> None:
    """Refuse (`OutputError`, one line naming the path) to replace ``out_dir`` unless it is absent or
    `made_by_mnnbuild`: a stage's output path that holds someone's files (an artifact root pointed at the wrong
    place) is never written over."""
    out_dir = Path(out_dir)
    if not (out_dir.exists() or out_dir.is_symlink()) or made_by_mnnbuild(out_dir):
        return
    kind = "a symlink" if out_dir.is_symlink() else "a directory" if out_dir.is_dir() else "a file"
    raise OutputError(
        f"{out_dir}: {kind} mnnbuild did not make (no stage manifest in it) is where this stage writes; left it "
        "as it was. Move it away, or set MNNBUILD_ARTIFACTS to a directory of its own"
    )


def remove_stage_dir(path: Path) -> None:
    """``doit clean``: delete the stage dir ``path`` if mnnbuild made it (`made_by_mnnbuild`); anything else there
    is left as it was, with a warning."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    if not made_by_mnnbuild(path):
        log.warning("%s: not removed: mnnbuild did not make it (no stage manifest in it)", path)
        return
    shutil.rmtree(path, ignore_errors=True)


def remove_stage_dirs(group: Path) -> None:
    """``doit clean`` of a per-plugin stage (``<arch>/context``): each plugin dir mnnbuild made, then the group dir
    if that left it empty."""
    group = Path(group)
    if group.is_symlink() or not group.is_dir():
        remove_stage_dir(group)
        return
    for name in sorted(os.listdir(group)):
        if (group / name).is_dir() and not name.startswith("."):
            remove_stage_dir(group / name)
    with contextlib.suppress(OSError):
        group.rmdir()


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory ``src`` to ``dst``, replacing an existing ``dst`` (one mnnbuild made: `check_replaceable`)
    with two renames."""
    check_replaceable(dst)
    old = None
    if dst.exists() or dst.is_symlink():
        old = temp_path(dst, "old")
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write a file through a temp name and rename, so readers never see it half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = temp_path(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` for text read from a file: JSON nested deeper than Python's recursion limit (``[[[...`` a few
    thousand deep) is a ValueError like any other bad JSON, not a RecursionError traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than a JSON reader goes (thousands of levels)") from None


def read_json_object(
    path: Path,
    error: type[MnnbuildError],
    *,
    missing: str | None = None,
    unreadable: str = "cannot read",
    invalid: str | None = None,
) -> dict[str, Any]:
    """The JSON object in ``path`` (UTF-8); any problem is one ``error`` naming the file: ``<path>: <missing>`` for
    a missing file when ``missing`` says what that means, ``<path>: <unreadable>: <why>`` for a file that cannot be
    read, ``<path>: <invalid>: <why>`` for one that is not JSON (``invalid`` defaults to ``unreadable``), and
    ``<path>: expected a JSON object, got <type>`` for other JSON."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        if missing is not None and isinstance(exc, FileNotFoundError):
            raise error(f"{path}: {missing}") from None
        raise error(f"{path}: {unreadable}: {exc}") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise error(f"{path}: {invalid or unreadable}: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def relative_symlink(target: Path, link: Path) -> None:
    """Create ``link`` pointing at ``target`` by a relative path (portable when both move together)."""
    rel = os.path.relpath(Path(target).resolve(), Path(link).parent.resolve())
    os.symlink(rel, link)


def confined(base: Path, rel: str, what: str, *, follow_last: bool = True) -> Path:
    """``base / rel`` for a relative path read from a file, refused unless it stays inside ``base``.

    ``rel`` may not be absolute or contain ``..``, and once resolved (symlinks already in ``base``
    followed) it must still lie under ``base``: a path read from a cache entry, manifest or model
    directory can never name a file elsewhere. ``what`` says where ``rel`` came from, for the error.
    ``follow_last=False`` resolves only the directories on the way: the entry itself may be a symlink
    (a fetched model dir links its files to the source model).
    """
    pure = PurePosixPath(rel)
    if not rel or "\\" in rel or pure.is_absolute() or ".." in pure.parts or "\0" in rel:
        raise UnsafePathError(f"{what}: path {rel!r} must be relative, without '..', inside {base}")
    root = Path(base).resolve()
    resolved = (root / pure).resolve() if follow_last else (root / pure).parent.resolve() / pure.name
    if root not in resolved.parents:
        raise UnsafePathError(f"{what}: path {rel!r} leads outside {base} (to {resolved}) through a symlink")
    return Path(base) / pure
