"""The runtime's PEP 517 build backend: setuptools, run on a temp copy of the distribution's sources.

The runtime ships the format layers it runs on (``RUNTIME_MODULES`` of package ``mnnbuild``), which live in the
build's tree (``../mnnbuild``) in a checkout and inside the distribution (``./mnnbuild``) in its sdist. Each hook
copies this dir and those modules into a temp dir and lets setuptools build there: an sdist is then standalone,
and ``pip install ./runtime`` leaves no ``build/`` or egg-info in the source tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setuptools import build_meta

RUNTIME_MODULES = (
    "__init__.py",
    "base/__init__.py",
    "base/errors.py",
    "base/fsutil.py",
    "base/native.py",
    "cpu",
    "mnn",
    "qnn",
)
"""What of package ``mnnbuild`` the runtime imports (``tests/test_layers.py`` keeps it to these)."""

_HERE = Path(__file__).resolve().parent
_SKIP_NAMES = ("__pycache__", "*.pyc", "build", "dist", "*.egg-info")


def _format_layers() -> Path:
    """Package ``mnnbuild`` as the sdist holds it, or else the checkout's."""
    for candidate in (_HERE / "mnnbuild", _HERE.parent / "mnnbuild"):
        if (candidate / "__init__.py").is_file():
            return candidate
    raise FileNotFoundError(f"package mnnbuild (its format layers) is neither in {_HERE} nor beside it")


@contextlib.contextmanager
def _staged() -> Iterator[Path]:
    """A temp copy of the distribution (this dir plus the format layers), the cwd while setuptools runs in it."""
    src = _format_layers()
    with tempfile.TemporaryDirectory(prefix="mnnbuild-runtime-build-") as tmp:
        stage = Path(tmp) / "src"
        shutil.copytree(_HERE, stage, ignore=shutil.ignore_patterns("mnnbuild", *_SKIP_NAMES))
        for name in RUNTIME_MODULES:
            if (src / name).is_dir():
                shutil.copytree(src / name, stage / "mnnbuild" / name, ignore=shutil.ignore_patterns(*_SKIP_NAMES))
            else:
                (stage / "mnnbuild" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / name, stage / "mnnbuild" / name)
        cwd = os.getcwd()
        os.chdir(stage)  # setuptools builds in the cwd; PEP 517 frontends call hooks in the source dir
        try:
            yield stage
        finally:
            os.chdir(cwd)


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    with _staged():
        return build_meta.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    with _staged():
        return build_meta.get_requires_for_build_sdist(config_settings)


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    out = os.path.abspath(wheel_directory)
    with _staged():
        return build_meta.build_wheel(out, config_settings)


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    out = os.path.abspath(sdist_directory)
    with _staged():
        return build_meta.build_sdist(out, config_settings)
