"""Errors of the bundle runtime. Messages name the file, the plugin, the attribute and what was expected."""

from __future__ import annotations

from mnnbuild.base.errors import MnnbuildError


class RuntimeBundleError(MnnbuildError):
    """Base class: a bundle cannot be loaded or run."""


class BundleError(RuntimeBundleError):
    """A bundle file is missing or its contents (config, ``qnn/llm.mnn``, plugin attributes) are invalid."""


class PluginShapeError(RuntimeBundleError):
    """A plugin's live input shapes match none of the shapes in its ``allInputShape``."""


class BinaryCheckError(RuntimeBundleError):
    """A plugin's context binary does not match its plugin attributes, cannot be read, or cannot be run."""
