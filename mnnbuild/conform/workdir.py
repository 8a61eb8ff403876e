"""conform's report dir, which the user may name (``--out``): written into, and its subdirs replaced, only when conform
made it.

conform marks the report dir it makes (:data:`MARKER`); one an earlier run wrote before the marker existed is known
by its ``conform.json``. Inside a report dir of conform's, its own subdirs (``bundle/``, ``original/``,
``compilefornpu/``, ...) are replaced on every run; any other directory is the user's, and conform stops with one
line naming it rather than write into it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mnnbuild.base.errors import ConformDirError
from mnnbuild.base.fsutil import parse_json

MARKER = ".mnnbuild-conform"
REPORT = "conform.json"
_MARKER_TEXT = "made by python -m mnnbuild conform; its next run replaces what it wrote here\n"


def made_by_conform(path: Path) -> bool:
    """Whether ``path`` is a report dir conform made: its marker, or an earlier run's ``conform.json``."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    if (path / MARKER).is_file():
        return True
    try:
        report = parse_json((path / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and "mnn_build" in report


def claim_dir(path: Path) -> Path:
    """``path`` as conform's report dir: made (and marked) when absent or empty; an existing one must be conform's."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ConformDirError(f"{path}: a file or symlink, not a directory conform can write its report into")
    if path.is_dir() and os.listdir(path) and not made_by_conform(path):
        raise ConformDirError(
            f"{path}: a directory conform did not make (no {MARKER} or {REPORT} in it); left it as it was. Pass "
            "--out a new or empty directory, or one an earlier conform run wrote"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text(_MARKER_TEXT, encoding="utf-8")
    return path


def fresh_dir(path: Path) -> Path:
    """An empty directory at ``path``, one of conform's own subdirs of its report dir (``path.parent``, which must be
    conform's: :func:`claim_dir`); what an earlier run left there is removed."""
    path = Path(path)
    if not made_by_conform(path.parent):
        raise ConformDirError(
            f"{path.parent}: not a report dir conform made (no {MARKER} in it); {path.name}/ not written"
        )
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir()
    return path
