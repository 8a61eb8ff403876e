"""The project a DAG is declared from: specs, settings, and doit's configuration."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doit.exceptions import InvalidDodoFile

from mnnbuild.cache import local_cache_dir
from mnnbuild.dag.reporter import BuildSummaryReporter
from mnnbuild.errors import MnnbuildError
from mnnbuild.fingerprint import DigestMemo
from mnnbuild.layout import CODE_DIGESTS, stage_dir
from mnnbuild.settings import Settings
from mnnbuild.spec import ModelSpec, discover_specs

# What a bare `doit` builds: the shipped tiny model, so a fresh clone proves the whole chain.
DEFAULT_MODEL = "tiny-qwen3"


@dataclass(frozen=True)
class Project:
    """The specs and settings every task is declared from."""

    settings: Settings
    specs: dict[str, ModelSpec]
    memo: DigestMemo

    @classmethod
    def load(cls, project_root: Path) -> Project:
        settings = Settings.from_env(project_root)
        try:
            specs = discover_specs(list(settings.spec_dirs))
        except MnnbuildError as exc:
            # doit prints InvalidDodoFile as one clean line instead of a traceback
            raise InvalidDodoFile(str(exc)) from None
        for spec in specs.values():
            # the spec format knows the VL and embedding families (docs/families.md); the stages do not yet, and
            # building such a model as a text LLM would give a wrong bundle rather than an error
            if spec.family != "llm":
                raise InvalidDodoFile(
                    f"{spec.spec_path}: field 'family': {spec.family!r} models cannot be built yet (only 'llm'); "
                    "see docs/families.md"
                )
        # beside a local cache, the memo serves every artifact root and clone that shares the cache
        memo_dir = local_cache_dir(os.environ) or settings.artifact_root
        memo = DigestMemo(memo_dir / CODE_DIGESTS)
        return cls(settings=settings, specs=specs, memo=memo)

    def stage_dir(self, stage: str, spec: ModelSpec, arch: str | None = None) -> Path:
        """Where ``stage`` writes for ``spec`` (and ``arch``, for the per-target stages)."""
        return stage_dir(self.settings.artifact_root, stage, spec.name, arch)

    def default_tasks(self) -> list[str]:
        # verifying a bundle builds it first, so a bare `doit` builds, proves and reports the default model
        spec = self.specs.get(DEFAULT_MODEL)
        if spec is None:
            return []
        return [f"{stage}:{spec.name}-{arch}" for arch in spec.targets for stage in ("verify", "report")]

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
        return {
            "dep_file": str(self.settings.artifact_root / ".doit.db"),
            "backend": "sqlite3",
            "check_file_uptodate": "md5",
            "subtasks": True,
            "default_tasks": self.default_tasks(),
            "verbosity": 1,
            "reporter": BuildSummaryReporter,
        }
