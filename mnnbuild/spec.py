"""Model specs: one TOML file per model, parsed into a pydantic model.

A spec says where the MNN LLM comes from (a local directory or a Hugging Face repo),
the prefill chunk size and which NPU targets to build. Specs are found in the
project's ``models/`` directory and in every directory of ``MNNBUILD_MODELS_PATH``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mnnbuild.errors import SpecError
from mnnbuild.targets import Soc, known_archs, soc_for_arch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


class LocalSource(BaseModel):
    """A model directory on this machine, relative to the spec file or absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    local: str

    @property
    def kind(self) -> Literal["local"]:
        return "local"


class HfSource(BaseModel):
    """A Hugging Face model repo holding an exported MNN LLM."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    hf: Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]
    revision: str = "main"

    @property
    def kind(self) -> Literal["hf"]:
        return "hf"


class ModelSpec(BaseModel):
    """One model to build bundles for, as written in ``models/<name>.toml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: LocalSource | HfSource
    chunk_size: Annotated[int, Field(gt=1, le=4096, description="Prefill tokens per chunk; decode is 1.")] = 128
    targets: Annotated[list[str], Field(min_length=1)]
    socs: dict[str, str] = Field(default_factory=dict, description="Per-arch SoC override, e.g. {v79 = 'SM8735'}.")
    seed: int = Field(default=0, description="Seed of the random io samples.")
    skips: list[str] = Field(default_factory=list, description="Op names the partition keeps on the CPU.")
    max_kv_size: int = Field(
        default=0, ge=0, description="KV cache length for NPU Attention; 0 keeps Attention on the CPU."
    )
    spec_path: Path = Field(exclude=True, description="The TOML file this spec was read from.")

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, targets: list[str]) -> list[str]:
        unknown = [t for t in targets if t not in known_archs()]
        if unknown:
            raise ValueError(f"unknown target {unknown[0]!r}; expected one of {', '.join(known_archs())}")
        if len(set(targets)) != len(targets):
            raise ValueError("targets are listed twice")
        return targets

    @model_validator(mode="after")
    def _socs_match_archs(self) -> ModelSpec:
        for arch, soc_name in self.socs.items():
            try:
                soc_for_arch(arch, soc_name)
            except KeyError as exc:
                raise ValueError(f"socs.{arch}: {exc.args[0]}") from None
        return self

    def soc(self, arch: str) -> Soc:
        """The SoC this spec builds for ``arch``."""
        return soc_for_arch(arch, self.socs.get(arch))

    def local_dir(self) -> Path:
        """The model directory of a ``local`` source, resolved against the spec file."""
        if not isinstance(self.source, LocalSource):
            raise TypeError(f"{self.name} is not a local model")
        path = Path(self.source.local).expanduser()
        return path if path.is_absolute() else (self.spec_path.parent / path).resolve()

    @property
    def lock_path(self) -> Path:
        """Where the resolved Hugging Face revision is pinned, next to the spec."""
        return self.spec_path.with_suffix(".lock.json")


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    got = f" (got {err['input']!r})" if err["type"] not in ("missing",) and "input" in err else ""
    msg = err["msg"].removeprefix("Value error, ")
    return f"field {loc!r}: {msg}{got}"


def load_spec(path: Path) -> ModelSpec:
    """Read and validate one spec file; every problem raises `SpecError` naming the file and field."""
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    if "spec_path" in data:
        raise SpecError(f"{path}: field 'spec_path' is set by mnnbuild and may not be written")
    try:
        return ModelSpec.model_validate({**data, "spec_path": path})
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors(include_url=False))
        raise SpecError(f"{path}: {problems}") from None


def discover_specs(spec_dirs: list[Path]) -> dict[str, ModelSpec]:
    """Load every ``*.toml`` in ``spec_dirs`` (in order); a name defined twice is an error."""
    specs: dict[str, ModelSpec] = {}
    for directory in spec_dirs:
        if not directory.is_dir():
            raise SpecError(f"{directory}: model spec directory does not exist")
        for path in sorted(directory.glob("*.toml")):
            spec = load_spec(path)
            if spec.name in specs:
                raise SpecError(f"{path}: model name {spec.name!r} is already defined by {specs[spec.name].spec_path}")
            specs[spec.name] = spec
    return specs
