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


def test_version_flag() -> None:
    """``python -m mnnbuild --version`` and the ``mnnbuild`` script print the package version."""
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout == f"mnnbuild {mnnbuild.__version__}\n"
    script = Path(sys.executable).parent / "mnnbuild"
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout == f"mnnbuild {mnnbuild.__version__}\n" == f"mnnbuild {metadata.version('mnnbuild')}\n"
