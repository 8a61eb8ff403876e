"""Where things are: the project's spec directories and the artifact root, from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODELS_PATH_ENV = "MNNBUILD_MODELS_PATH"
ARTIFACTS_ENV = "MNNBUILD_ARTIFACTS"


@dataclass(frozen=True)
class Settings:
    """Paths a build uses. Relative paths from the environment resolve against the project root."""

    project_root: Path
    artifact_root: Path
    spec_dirs: tuple[Path, ...]

    @classmethod
    def from_env(cls, project_root: Path, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        root = Path(project_root).resolve()

        def resolve(p: str) -> Path:
            path = Path(p).expanduser()
            return path if path.is_absolute() else (root / path).resolve()

        extra = [resolve(p) for p in env.get(MODELS_PATH_ENV, "").split(os.pathsep) if p.strip()]
        return cls(
            project_root=root,
            artifact_root=resolve(env.get(ARTIFACTS_ENV, "artifacts")),
            spec_dirs=(root / "models", *extra),
        )

    def model_root(self, model: str) -> Path:
        """``artifacts/<model>/``: everything built for one model."""
        return self.artifact_root / model

    def target_root(self, model: str, arch: str) -> Path:
        """``artifacts/<model>/<arch>/``: everything built for one model and target."""
        return self.artifact_root / model / arch
