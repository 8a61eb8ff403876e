"""The unshared twins a build made of a bundle's context binaries, found from its artifact dirs.

The x86 HTP library cannot load a weight-shared context binary, so running a bundle on this box means running
each plugin's unshared twin in its place (``binary_overrides``). The build's twin stage writes one per plugin,
``<target dir>/twin/<plugin>/``, with ``twin.manifest.json`` naming it and its sha256; the context stage's
``<target dir>/context/<plugin>/context.manifest.json`` records the shipped binary's sha256, which ties the
twin to the bundle file it stands in for. Only those JSON fields are read here (the runtime knows nothing else
of the build), and no path read from them leaves its plugin's dir.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import UnsafePathError
from mnnbuild.base.fsutil import MANIFEST_SUFFIX, confined
from mnnbuild_runtime.bundle import read_json_object
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.hashes import FileHashes, read_stamped
from mnnbuild_runtime.plugin import BinaryOverride

TWIN_DIR = "twin"
CONTEXT_DIR = "context"
TWIN_MANIFEST = f"twin{MANIFEST_SUFFIX}"
CONTEXT_MANIFEST = f"context{MANIFEST_SUFFIX}"


@dataclass(frozen=True)
class Twin:
    """The binary the simulator runs for one plugin, as the twin stage built and recorded it."""

    binary: str
    """The shipped binary it stands in for, as the Plugin op names it (e.g. ``qnn/graphllm0.bin``)."""
    graphs: list[str]
    path: Path
    sha256: str
    """Its sha256 in the twin manifest."""
    shipped_sha256: str
    """The shipped binary's sha256 in the context manifest."""

    def read(self, hashes: FileHashes | None = None) -> bytes:
        """Its bytes, which must still have the recorded hash (``hashes``: where a hash known with the file's stamp
        is found, `mnnbuild_runtime.hashes`)."""
        try:
            with open(self.path, "rb") as fh:
                data, stamp = read_stamped(fh)
        except OSError as exc:
            raise BundleError(f"plugin {self.binary}: cannot read its twin {self.path}: {exc}") from None
        digest = (hashes if hashes is not None else FileHashes()).digest(self.path, data, stamp)
        if digest != self.sha256:
            raise BundleError(
                f"plugin {self.binary}: twin {self.path} has sha256 {digest[:12]}…, the twin manifest records "
                f"{self.sha256[:12]}…: changed after the twin stage built it"
            )
        return data

    def override(self) -> BinaryOverride:
        """What the runtime runs in the shipped binary's place (read from the file when loaded, hash checked)."""
        return BinaryOverride(
            self.path,
            shipped_sha256=self.shipped_sha256,
            sha256=self.sha256,
            label=f"unshared twin of {self.binary} (sha256 {self.sha256[:12]}…)",
        )


def plugin_subdir(stage_dir: Path, binary: str) -> Path:
    """One plugin's dir of a per-plugin stage: ``qnn/graphllm0.bin`` -> ``<stage_dir>/graphllm0``."""
    return Path(stage_dir) / Path(binary).stem


def _manifest(path: Path) -> dict[str, Any]:
    # a stage dir's manifest, not a bundle file: links are followed, as for any file of the build
    return read_json_object(path, f"manifest missing; run the {path.name.split('.')[0]} stage first", links=True)


def _field(data: Mapping[str, Any], path: Path, name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise BundleError(f"{path}: field {name!r} is {value!r}, expected a non-empty string")
    return value


def _output_sha256(data: Mapping[str, Any], path: Path, rel: str) -> str:
    outputs = data.get("outputs")
    if not isinstance(outputs, list):
        raise BundleError(f"{path}: field 'outputs' is not a list")
    for rec in outputs:
        if isinstance(rec, dict) and rec.get("path") == rel and isinstance(rec.get("sha256"), str):
            return rec["sha256"]
    raise BundleError(f"{path}: field 'outputs' lists no {rel!r} with a sha256")


def twin_of(twin_stage_dir: Path, binary: str, shipped_sha256: str) -> Twin:
    """One plugin's twin as its twin manifest names and hashes it, tied to ``shipped_sha256`` (the shipped
    binary's hash as the context stage recorded it); a problem is a :class:`BundleError` naming the manifest
    and field."""
    where = plugin_subdir(twin_stage_dir, binary)
    twin_manifest = where / TWIN_MANIFEST
    twin = _manifest(twin_manifest)
    named = _field(twin, twin_manifest, "binary")
    if named != binary:
        raise BundleError(f"{twin_manifest}: the twin in this dir is {named}'s twin (field 'binary'), not {binary}'s")
    rel = _field(twin, twin_manifest, "twin")
    try:
        path = confined(where, rel, f"{twin_manifest} field 'twin'")
    except UnsafePathError as exc:
        raise BundleError(str(exc)) from None
    graphs = twin.get("graphs")
    if not isinstance(graphs, list) or not all(isinstance(g, str) for g in graphs):
        raise BundleError(f"{twin_manifest}: field 'graphs' is {graphs!r}, expected a list of graph names")
    return Twin(binary, list(graphs), path, _output_sha256(twin, twin_manifest, rel), shipped_sha256)


def shipped_sha256(context_stage_dir: Path, binary: str) -> str:
    """The shipped binary's sha256 in its context manifest (``<context_stage_dir>/<plugin>/``)."""
    manifest = plugin_subdir(context_stage_dir, binary) / CONTEXT_MANIFEST
    data = _manifest(manifest)
    return _output_sha256(data, manifest, _field(data, manifest, "binary"))


def read_twins(
    twin_stage_dir: Path, context_stage_dir: Path, binaries: Iterable[str]
) -> tuple[dict[str, Twin], list[str]]:
    """:func:`twin_of` for each plugin, tied to its context manifest; the problems are returned
    (``plugin <binary>: <why>``), not raised."""
    twins: dict[str, Twin] = {}
    problems = []
    for binary in binaries:
        try:
            twins[binary] = twin_of(twin_stage_dir, binary, shipped_sha256(context_stage_dir, binary))
        except BundleError as exc:
            problems.append(f"plugin {binary}: {exc}")
    return twins, problems


def _target_dirs(root: Path) -> list[Path]:
    """The target dirs under an artifact root: ``<root>/<model>/<arch>`` holding a twin dir."""
    return sorted(p.parent for p in root.glob(f"*/*/{TWIN_DIR}") if p.is_dir())


def find_target_dir(path: Path) -> Path:
    """``path`` itself when it is a target dir (``<root>/<model>/<arch>``, holding ``twin/`` and ``context/``),
    else the one target dir of the artifact root ``path``."""
    path = Path(path)
    if (path / TWIN_DIR).is_dir() and (path / CONTEXT_DIR).is_dir():
        return path
    if not path.is_dir():
        raise BundleError(f"{path}: not a directory (expected an artifact root or <root>/<model>/<arch>)")
    found = _target_dirs(path)
    if len(found) == 1:
        return found[0]
    if not found:
        raise BundleError(f"{path}: no <model>/<arch>/twin dir under it; build the bundle first (doit bundle)")
    names = ", ".join(str(p) for p in found)
    raise BundleError(f"{path}: holds several built targets ({names}); pass one of them")


def load_twins(artifact_root_or_target_dir: str | Path) -> dict[str, BinaryOverride]:
    """The ``binary_overrides`` that run a built bundle on this box: for each plugin its unshared twin, checked
    against the hashes the build recorded when loaded.

    ``artifact_root_or_target_dir``: ``artifacts/<model>/<arch>`` (or an artifact root holding exactly one such
    dir). Every plugin with a twin dir is included; a missing or inconsistent manifest is a :class:`BundleError`.
    """
    target = find_target_dir(Path(artifact_root_or_target_dir))
    twin_dir = target / TWIN_DIR
    binaries = []
    for sub in sorted(p for p in twin_dir.iterdir() if p.is_dir()):
        manifest = sub / TWIN_MANIFEST
        binary = _field(_manifest(manifest), manifest, "binary")
        if plugin_subdir(twin_dir, binary) != sub:
            raise BundleError(f"{manifest}: field 'binary' is {binary!r}, which is not this dir's plugin")
        binaries.append(binary)
    if not binaries:
        raise BundleError(f"{twin_dir}: no twin built; run the twin stage (doit twin)")
    twins, problems = read_twins(twin_dir, target / CONTEXT_DIR, binaries)
    if problems:
        raise BundleError(problems[0] + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""))
    return {binary: twin.override() for binary, twin in twins.items()}
