"""Errors of the bundle runtime (defined with every public error in `mnnbuild.base.errors`). Messages name the file,
the plugin, the attribute and what was expected."""

from __future__ import annotations

from mnnbuild.base.errors import BinaryCheckError, BundleError, PluginShapeError, RuntimeBundleError

__all__ = ["BinaryCheckError", "BundleError", "PluginShapeError", "RuntimeBundleError"]
