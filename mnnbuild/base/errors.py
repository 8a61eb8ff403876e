"""Errors raised by mnnbuild. Every message names the file, the field and what was expected."""

from __future__ import annotations


class MnnbuildError(Exception):
    """Base class for every error mnnbuild raises on bad input or a failed stage."""


class SpecError(MnnbuildError):
    """A model spec (TOML) is invalid."""


class ModelDirError(MnnbuildError):
    """A model directory is missing files or has invalid contents."""


class MNNFormatError(MnnbuildError):
    """A `.mnn` file or its weight file cannot be read or written."""


class QnnError(MnnbuildError):
    """A QNN library is missing or a QNN API call failed."""


class StageError(MnnbuildError):
    """A stage could not produce its outputs."""


class UnsafePathError(MnnbuildError):
    """A path read from a cache entry, manifest or model directory would leave the directory it belongs to."""


class OutputError(MnnbuildError):
    """An output cannot be written where it belongs (read-only or full file system, no permission)."""


class SettingsError(MnnbuildError):
    """An ``MNNBUILD_*`` environment variable has a value mnnbuild cannot use (empty, a URL, a file, the project
    itself, a log level that is none)."""
