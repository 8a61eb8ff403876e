"""Ships only the modules of package ``mnnbuild`` that the runtime imports (its format layers), not the build."""

from __future__ import annotations

from setuptools import setup
from setuptools.command.build_py import build_py

RUNTIME_MODULES = {"mnnbuild": {"__init__"}, "mnnbuild.base": {"__init__", "errors", "fsutil"}}
"""Per package, the modules shipped (packages not listed ship whole)."""


class BuildRuntimePy(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        keep = RUNTIME_MODULES.get(package)
        return modules if keep is None else [m for m in modules if m[1] in keep]


setup(cmdclass={"build_py": BuildRuntimePy})
