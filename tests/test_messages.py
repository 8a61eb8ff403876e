"""Messages that pointed the wrong way (issue 29), each as the user sees it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

BLOCK_S3FS = """
import importlib.abc


class NoS3fs(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "s3fs":
            raise ImportError("No module named 's3fs'")
        return None


import sys

sys.meta_path.insert(0, NoS3fs())
"""
"""A ``sitecustomize`` that makes s3fs absent, whether or not this venv has it."""


def test_s3_cache_without_s3fs_says_what_is_missing(tmp_path: Path) -> None:
    """``MNNBUILD_CACHE=s3://...`` without s3fs: `cache info` says the s3:// file system needs a package that is not
    installed, in one line, and never that the cache is off (``MNNBUILD_CACHE=off``)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_S3FS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update({"MNNBUILD_CACHE": "s3://bucket/cache", "PYTHONPATH": str(site)})
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "cache", "info"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: MNNBUILD_CACHE='s3://bucket/cache': its s3:// file system needs a package"), line
    assert "not installed" in line and "s3fs" in line and "off" not in line, line


def test_cache_off_names_the_value_that_turned_it_off(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env["MNNBUILD_CACHE"] = "none"
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "cache", "info"], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == "the artifact cache is off (MNNBUILD_CACHE='none'); --url names one\n"
