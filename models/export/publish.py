"""Publishing a model directory the export tools made: written beside its destination, renamed into place whole.

``--out`` replaces its directory, so what is there is checked first: only nothing, an empty directory or a model
directory (model files and no subdirectories) is ever replaced. A mistyped ``--out ~`` is refused in one line
before any work, not deleted after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: A directory holding one of these (and no subdirectory) is a model directory an export made.
MODEL_MARKERS = ("llm.mnn", "embedding.mnn", "llm_config.json")


class PublishError(ValueError):
    """A destination the export tools may not replace (one line naming it and what to do)."""


def check_replaceable(dest: Path) -> None:
    """Refuse a ``dest`` that is a file, a symlink, or a directory other than an empty or model directory."""
    dest = Path(dest)
    if not (dest.exists() or dest.is_symlink()):
        return
    if dest.is_symlink() or not dest.is_dir():
        raise PublishError(f"{dest}: not a directory (a file or a symlink); --out must name a model directory")
    entries = list(dest.iterdir())
    if not entries:
        return
    subdirs = [e.name for e in entries if e.is_dir() or e.is_symlink()]
    if subdirs or not any((dest / m).is_file() for m in MODEL_MARKERS):
        what = f"it holds {sorted(subdirs)[0]}/" if subdirs else f"it holds none of {', '.join(MODEL_MARKERS)}"
        raise PublishError(
            f"{dest}: not a model directory ({what}); --out replaces its directory as a whole, so it must be new, "
            "empty or an exported model. Left it as it was: choose another --out"
        )


@contextlib.contextmanager
def staged_model_dir(dest: Path) -> Iterator[Path]:
    """Yield a fresh directory beside ``dest``; when the block ends without an error it replaces ``dest`` (two
    renames), otherwise it is removed and ``dest`` is left as it was."""
    dest = Path(dest)
    check_replaceable(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private
        check_replaceable(dest)  # the work took minutes: dest may have changed meanwhile
        old = None
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
            os.replace(dest, old / dest.name)
        os.replace(staging, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
