"""Packaging that resolves well: lower bounds, upper bounds only where a layout is checked, metadata, --version."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import mnnbuild
from tests.conftest import PROJECT_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CHECKED_LAYOUTS = {"mnn", "onnxruntime-qnn"}
"""Distributions whose layout the code reads directly (MNN's format and CPU runtime; the QNN C API): bounded above."""
EXACT_ALLOWED = {"flatc", "llmexport"}
"""Tools pinned on purpose: flatc must match the generated schema module; llmexport's export API changes per 0.0.x."""


def project(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))["project"]


@pytest.mark.parametrize("pyproject", [PROJECT_ROOT / "pyproject.toml", PROJECT_ROOT / "runtime" / "pyproject.toml"])
def test_dependencies_have_lower_bounds_and_checked_upper_bounds(pyproject: Path) -> None:
    meta = project(pyproject)
    extras = meta.get("optional-dependencies", {})
    reqs = [Requirement(r) for r in meta["dependencies"] + [r for group in extras.values() for r in group]]
    for req in reqs:
        name = req.name.lower()
        ops = {s.operator for s in req.specifier}
        if name in EXACT_ALLOWED:
            continue
        assert "==" not in ops, f"{pyproject}: {req} is pinned exactly"
        assert ops & {">=", ">"}, f"{pyproject}: {req} has no lower bound"
        assert bool(ops & {"<", "<="}) == (name in CHECKED_LAYOUTS), f"{pyproject}: {req}: upper bound iff checked"
    assert meta["license"] == "Apache-2.0"
    installed = {r.name.lower(): r for r in reqs if r.marker is None or r.marker.evaluate()}
    for name in CHECKED_LAYOUTS:  # what is installed here is what was checked
        assert installed[name].specifier.contains(metadata.version(name)), (name, metadata.version(name))


def test_extras_and_urls() -> None:
    meta = project(PROJECT_ROOT / "pyproject.toml")
    extras = meta["optional-dependencies"]
    assert isinstance(extras["remote"], list) and any(Requirement(r).name == "fsspec" for r in extras["remote"])
    torch = next(Requirement(r) for r in extras["export"] if r.startswith("torch"))
    assert torch.specifier.contains("2.13.0"), "the CPU torch wheel the export venv installs from"
    assert meta["urls"] and all(u.startswith("https://") for u in meta["urls"].values())


@pytest.mark.slow
def test_version_flag() -> None:
    """``python -m mnnbuild --version`` and the ``mnnbuild`` script print the package version."""
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout == f"mnnbuild {mnnbuild.__version__}\n"
    script = Path(sys.executable).parent / "mnnbuild"
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout == f"mnnbuild {mnnbuild.__version__}\n" == f"mnnbuild {metadata.version('mnnbuild')}\n"


def test_library_helpers_replace_the_hand_written_ones(tmp_path: Path) -> None:
    """Sizes through pydantic's ByteSize (one unit family), the user cache dir through platformdirs (the build's
    cache and conform's share it), file hashes through hashlib.file_digest."""
    import hashlib

    import platformdirs

    from mnnbuild.base.fsutil import sha256_file
    from mnnbuild.base.sizes import human_bytes, parse_size
    from mnnbuild.base.userdirs import user_cache_dir
    from mnnbuild.conform.build import cache_root
    from mnnbuild.pipeline.cache import default_cache_url

    assert human_bytes(3 << 20) == "3.0 MiB" and human_bytes(1536) == "1.5 KiB" and parse_size("2GiB") == 2 << 30
    assert user_cache_dir({}) == Path(platformdirs.user_cache_dir("mnnbuild", appauthor=False))
    assert default_cache_url({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mnnbuild")
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == (tmp_path / "mnnbuild" / "conform").resolve()
    data = tmp_path / "f.bin"
    data.write_bytes(b"x" * (9 << 20))  # more than one of the fallback's chunks
    assert sha256_file(data) == hashlib.sha256(data.read_bytes()).hexdigest()
