"""The code base stays ruff clean (pyproject.toml holds the rules)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import PROJECT_ROOT


def test_ruff_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(PROJECT_ROOT)], capture_output=True, text=True, cwd=PROJECT_ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
