"""Stage manifests: what a stage read, with which parameters and tools, and what it wrote.

Every stage writes ``<stage>.manifest.json`` inside its output directory. A manifest names
files by content (size + sha256), holds no timestamps, and carries a schema version derived
from its pydantic model's JSON schema, so a changed manifest model is detected on read.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

import mnnbuild
from mnnbuild.base.errors import ManifestMissing, MnnbuildError, UpstreamError, field_problems
from mnnbuild.base.fsutil import atomic_write_text, hash_stamped, parse_json, sha256_bytes
from mnnbuild.pipeline.fingerprint import DigestMemo, code_fingerprint
from mnnbuild.pipeline.layout import manifest_file

M = TypeVar("M", bound="Manifest")

_SCHEMA_HASH = re.compile(r"[0-9a-f]{16}")
"""What `Manifest.schema_hash` is: a memo's entry that is not one is made again."""
_SCHEMA_HASHES: dict[type, str] = {}
"""`Manifest.schema_hash` by class, once per process (as `functools.cache` would): a class's schema cannot change
while the process runs."""


def _without_docs(schema: Any) -> Any:
    """A JSON schema without its ``description`` and ``title`` entries (field *names* stay: they are keys)."""
    if isinstance(schema, dict):
        return {
            k: _without_docs(v) for k, v in schema.items() if not (k in ("description", "title") and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [_without_docs(v) for v in schema]
    return schema


class FileRecord(BaseModel):
    """One file by path (relative to a stated base), size and sha256."""

    model_config = ConfigDict(frozen=True)

    path: str
    size: int
    sha256: str
    _hashed: tuple[list[int], str] | None = PrivateAttr(default=None)

    @property
    def stamp(self) -> list[int] | None:
        """The stamp the file had while this process hashed it to this sha256 (`of`), when it proves the content later
        (`mnnbuild.base.fsutil.hash_stamped`); never written: the cache vouches for a blob by it."""
        if self._hashed is None or self._hashed[1] != self.sha256:
            return None  # a copy of the record with another sha256 is not what was hashed
        return self._hashed[0]

    def __eq__(self, other: object) -> bool:
        # what the record says (path, size, sha256), not how this process came by it (its stamp)
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), self.path, self.size, self.sha256))

    def under(self, stage_dir: str) -> FileRecord:
        """This record re-rooted onto ``stage_dir`` (an upstream stage dir's name, ``model``, ``partition``...): how a
        stage records, relative to the artifact root's model dir, a file it read of another stage."""
        return self.model_copy(update={"path": f"{stage_dir}/{self.path}"})

    @classmethod
    def of(cls, path: Path, base: Path) -> FileRecord:
        path = Path(path)
        sha, stamp = hash_stamped(path)
        record = cls(
            path=Path(path).relative_to(base).as_posix() if path.is_absolute() else path.as_posix(),
            size=stamp[0] if stamp is not None else path.stat().st_size,
            sha256=sha,
        )
        record._hashed = (stamp, sha) if stamp is not None else None
        return record


class Manifest(BaseModel):
    """Base of every stage manifest. Subclasses set ``stage`` and type ``params``."""

    model_config = ConfigDict(extra="forbid")

    stage: ClassVar[str] = ""

    schema_version: str = Field(default="", description="Hash of this manifest model's JSON schema.")
    model: str = Field(description="Model name from the spec.")
    target: str | None = Field(default=None, description="DSP arch, for target-dependent stages.")
    inputs: list[FileRecord] = Field(
        default_factory=list, description="Files read, relative to the artifact root or the source dir."
    )
    params: Any = None
    tools: dict[str, str] = Field(default_factory=dict, description="Versions of mnnbuild and the external tools used.")
    outputs: list[FileRecord] = Field(default_factory=list, description="Files written, relative to the output dir.")

    @classmethod
    def schema_hash(cls, memo: DigestMemo | None = None) -> str:
        """A short hash of this model's JSON schema: changes exactly when the manifest format does.

        Descriptions and titles are left out: fixing a field's wording is not a new format. With a ``memo`` (a doit
        run's), remembered across runs by the code digest of the model's module and its imports of ours, with the
        Python and pydantic versions, which together make the schema: a run whose code is unchanged builds no schema
        (its stage keys ask first, with the memo; its manifest reads after them, without).
        """
        known = _SCHEMA_HASHES.get(cls)
        if known is not None:
            return known
        if memo is None:
            made = cls._make_schema_hash()
        else:
            code = code_fingerprint(cls.__module__, memo)
            made_of = f"{sys.version_info[0]}.{sys.version_info[1]} {pydantic.VERSION} {code}"
            made = memo.remembered(f"schema {cls.__module__}.{cls.__qualname__} {made_of}", cls._make_schema_hash,
                                   _SCHEMA_HASH.fullmatch)  # fmt: skip
        return _SCHEMA_HASHES.setdefault(cls, made)

    @classmethod
    def _make_schema_hash(cls) -> str:
        schema = json.dumps(_without_docs(cls.model_json_schema()), sort_keys=True)
        return sha256_bytes(f"{cls.stage}:{schema}".encode())[:16]

    @model_validator(mode="after")
    def _fill_schema_version(self) -> Manifest:
        if not self.schema_version:
            self.schema_version = self.schema_hash()
        return self

    @classmethod
    def filename(cls) -> str:
        return manifest_file(cls.stage)

    def write(self, out_dir: Path) -> Path:
        """Write this manifest into ``out_dir`` (atomically) and return its path."""
        path = Path(out_dir) / self.filename()
        atomic_write_text(path, self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls: type[M], out_dir: Path) -> M:
        """Read the manifest a stage left in ``out_dir``; errors name the file and the problem."""
        path = Path(out_dir) / cls.filename()
        try:
            data = parse_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ManifestMissing(f"{path}: manifest missing; run the {cls.stage} stage first") from None
        except ValueError as exc:  # not UTF-8, not JSON
            raise UpstreamError(f"{path}: manifest is not valid JSON: {exc}") from None
        except OSError as exc:  # a directory in its place, no permission
            raise UpstreamError(f"{path}: cannot read the manifest ({exc.strerror or exc}); the {cls.stage} stage "
                                "must be re-run") from None  # fmt: skip
        if not isinstance(data, dict):
            raise UpstreamError(f"{path}: expected a JSON object, got {type(data).__name__}; the {cls.stage} stage "
                                "must be re-run")  # fmt: skip
        if data.get("schema_version") != cls.schema_hash():
            raise UpstreamError(
                f"{path}: field 'schema_version' is {data.get('schema_version')!r}, expected "
                f"{cls.schema_hash()!r}; the {cls.stage} stage must be re-run"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UpstreamError(f"{path}: invalid {cls.stage} manifest: {field_problems(exc)}") from None

    def output(self, rel_path: str) -> FileRecord:
        """The output record for a path relative to the output dir."""
        for rec in self.outputs:
            if rec.path == rel_path:
                return rec
        raise KeyError(rel_path)

    def outputs_in(self, dirs: Collection[str]) -> list[FileRecord]:
        """The output records of the files directly in ``dirs`` (paths relative to the output dir, e.g. the
        modellib files of one plugin's graphs): what a downstream stage read, recorded as its inputs."""
        return [rec for rec in self.outputs if Path(rec.path).parent.as_posix() in dirs]


def package_version(dist: str) -> str | None:
    """Installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def qnn_build_id() -> str:
    """Which QNN libraries the QNN stages would load, without loading them (task keys only).

    The PyPI package's version (or the SDK directory) plus the backend library's size: a new QNN
    changes it, and a checkout elsewhere with the same package keeps its cache hits. Manifests
    record the build id the library itself reports.
    """
    from mnnbuild.qnn.library import find_qnn_libraries  # the QNN format layer, for the stages that call QNN only

    try:
        paths = find_qnn_libraries()
    except MnnbuildError as exc:
        return f"unavailable ({exc})"
    where = package_version("onnxruntime-qnn") if paths.source == "onnxruntime_qnn" else str(paths.lib_dir)
    return f"{paths.source} {where} {paths.backend.stat().st_size}"


def tool_versions(*, mnn: bool = False, qnn: str | None = None) -> dict[str, str]:
    """Versions a manifest records: mnnbuild always, MNN and the QNN build when the stage used them."""
    tools = {"mnnbuild": mnnbuild.__version__}
    if mnn:
        tools["MNN"] = package_version("MNN") or "unknown"
    if qnn:
        tools["QNN"] = qnn
    return tools


_HASHING_THREADS = 2


def record_outputs(out_dir: Path, exclude: tuple[str, ...] = ()) -> list[FileRecord]:
    """Records for every regular file under ``out_dir`` (sorted, symlinks followed)."""
    out_dir = Path(out_dir)
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name not in exclude)
    # hashlib lets go of the GIL while it hashes: two files at a time use both cores of a small box (measured:
    # docs/benchmarks.md, "Numbers behind the code")
    with ThreadPoolExecutor(max_workers=_HASHING_THREADS) as pool:
        return list(pool.map(lambda p: FileRecord.of(p, out_dir), files))
