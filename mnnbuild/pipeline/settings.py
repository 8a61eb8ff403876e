"""Where things are: the project's spec directories and the artifact root, from the environment.

Both are checked before anything is written: an empty value, a URL, a file, or an artifact root that is, holds or
lies inside the project's sources, a spec directory or a model directory is one line (`SettingsError`), never a
build that writes over them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mnnbuild.base.errors import SettingsError

MODELS_PATH_ENV = "MNNBUILD_MODELS_PATH"
ARTIFACTS_ENV = "MNNBUILD_ARTIFACTS"
DEFAULT_ARTIFACTS = "artifacts"
"""The artifact root when ``MNNBUILD_ARTIFACTS`` is unset: the only place inside the project an artifact root may be."""


def _inside(path: Path, other: Path) -> bool:
    """Whether ``path`` is ``other`` or lies inside it (both resolved)."""
    return path == other or other in path.parents


@dataclass(frozen=True)
class Settings:
    """Paths a build uses. Relative paths from the environment resolve against the project root."""

    project_root: Path
    artifact_root: Path
    spec_dirs: tuple[Path, ...]

    @classmethod
    def from_env(cls, project_root: Path, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings ``environ`` (default: this process's) gives; a `SettingsError` names the variable and what
        is wrong with it (see `check_artifact_root`)."""
        env = os.environ if environ is None else environ
        root = Path(project_root).resolve()

        def resolve(name: str, value: str) -> Path:
            if not value.strip():
                raise SettingsError(f"{name} is set but empty; unset it or name a directory")
            if "://" in value:
                raise SettingsError(f"{name}={value!r} is a URL; expected a local directory")
            path = Path(value).expanduser()
            path = path if path.is_absolute() else root / path
            resolved = path.resolve()
            if resolved.exists() and not resolved.is_dir():
                raise SettingsError(f"{name}={value!r}: {resolved} is not a directory")
            return resolved

        extra: list[Path] = []
        if MODELS_PATH_ENV in env:
            value = env[MODELS_PATH_ENV]
            if "://" in value:  # before splitting at ':', which would cut the URL in two
                raise SettingsError(f"{MODELS_PATH_ENV}={value!r} holds a URL; expected local directories")
            entries = [p for p in value.split(os.pathsep) if p.strip()]
            if not entries:
                raise SettingsError(f"{MODELS_PATH_ENV} is set but empty; unset it or name spec directories")
            extra = [resolve(MODELS_PATH_ENV, p) for p in entries]
        settings = cls(
            project_root=root,
            artifact_root=resolve(ARTIFACTS_ENV, env.get(ARTIFACTS_ENV, DEFAULT_ARTIFACTS)),
            spec_dirs=(root / "models", *extra),
        )
        settings.check_artifact_root()
        return settings

    def check_artifact_root(self, model_dirs: Iterable[Path] = ()) -> None:
        """Refuse an artifact root that is, holds or lies inside what a build must never write over: the project
        (but for its ``artifacts/`` dir, the default root), the mnnbuild packages, a spec directory or one of
        ``model_dirs`` (local models' directories). Stages write ``<root>/<model>/<stage>``, so any of these as
        the root would put build outputs in place of the user's files."""
        root = self.artifact_root
        default = (self.project_root / DEFAULT_ARTIFACTS).resolve()
        if _inside(root, self.project_root) and not _inside(root, default):
            where = "is the project directory" if root == self.project_root else "lies inside the project"
            raise SettingsError(
                f"{ARTIFACTS_ENV}: the artifact root {root} {where} ({self.project_root}); expected a directory "
                f"outside it, or unset for {default}"
            )
        guarded = [("the project", self.project_root), *_package_dirs()]
        guarded += [("spec directory", Path(d).resolve()) for d in self.spec_dirs]
        guarded += [("model directory", Path(d).resolve()) for d in model_dirs]
        for what, path in guarded:
            if _inside(path, root):
                raise SettingsError(
                    f"{ARTIFACTS_ENV}: the artifact root {root} holds {what} {path}; expected a directory of its own"
                )
            if what != "the project" and _inside(root, path):
                raise SettingsError(
                    f"{ARTIFACTS_ENV}: the artifact root {root} lies inside {what} {path}; expected a directory "
                    "of its own"
                )

    def model_root(self, model: str) -> Path:
        """``artifacts/<model>/``: everything built for one model."""
        return self.artifact_root / model

    def target_root(self, model: str, arch: str) -> Path:
        """``artifacts/<model>/<arch>/``: everything built for one model and target."""
        return self.artifact_root / model / arch


def _package_dirs() -> list[tuple[str, Path]]:
    """The installed mnnbuild packages' source dirs (outside the project when installed without ``-e``)."""
    import importlib.util

    found = []
    for name in ("mnnbuild", "mnnbuild_runtime"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append((f"the {name} package", Path(spec.origin).resolve().parent))
    return found
