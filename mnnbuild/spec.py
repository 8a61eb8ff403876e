"""Model specs: one TOML file per model, parsed into a pydantic model.

A spec says where the MNN LLM comes from (a local directory or a Hugging Face repo),
the prefill chunk size and which NPU targets to build. Specs are found in the
project's ``models/`` directory and in every directory of ``MNNBUILD_MODELS_PATH``.
"""

from __future__ import annotations

import re
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
#: The model's directory name on the device (a local dir's or HF repo's name): it reaches shell scripts.
DEVICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


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
            if arch not in self.targets:
                raise SpecFieldError(
                    f"socs.{arch}", f"{arch} is not in targets {self.targets}; add it there or drop the override"
                )
            try:
                soc_for_arch(arch, soc_name)
            except KeyError as exc:
                raise SpecFieldError(f"socs.{arch}", exc.args[0]) from None
        return self

    @model_validator(mode="after")
    def _device_name_is_plain(self) -> ModelSpec:
        field, name = (
            ("source.hf", self.source.hf.rpartition("/")[2])
            if isinstance(self.source, HfSource)
            else ("source.local", self.local_dir().name)
        )
        if not re.fullmatch(DEVICE_NAME_PATTERN, name):
            raise SpecFieldError(
                field,
                f"the model directory name {name!r} becomes a path on the device and in push.sh/run.sh; it may "
                "only hold letters, digits, '.', '_' and '-' and start with a letter or digit",
            )
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


class SpecFieldError(ValueError):
    """A whole-spec check that blames one field (so the message names it, not the whole spec)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}\0{problem}")


def _describe(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if "\0" in msg:  # a SpecFieldError: the field it names and its problem, without the spec dump
        field, _, problem = msg.partition("\0")
        return f"field {field!r}: {problem}"
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    got = f" (got {err['input']!r})" if err["type"] not in ("missing",) and "input" in err and err["loc"] else ""
    return f"field {loc!r}: {msg}{got}"


def load_spec(path: Path) -> ModelSpec:
    """Read and validate one spec file; every problem raises `SpecError` naming the file and field."""
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file does not exist") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected a UTF-8 TOML file"
        ) from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec file: {exc.strerror}") from None
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
