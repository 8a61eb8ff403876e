"""What the DAG knows of a model: the `Models` a chain is declared over (mnnbuild's: `mnnbuild.model.spec.MODELS`).

`mnnbuild.dag` loops over the models `Models.discover` returns and reads of each only what `Model` names; everything
else a spec says reaches a run through its stage's ``params_of`` and ``fields_of``. So dag/ imports no model code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from mnnbuild.base.errors import SpecError


class ModelSource(Protocol):
    """Where a model comes from."""

    @property
    def kind(self) -> Literal["local", "hf"]:
        """``local``: a directory on this machine (`Model.local_dir`); ``hf``: a pinned remote repo
        (`Model.lock_path`)."""
        ...

    @property
    def where(self) -> str:
        """The source as its spec writes it (a path, or ``repo@revision``), for a task's doc."""
        ...


class Model(Protocol):
    """One model the chain builds, as the DAG sees it."""

    @property
    def name(self) -> str: ...

    @property
    def targets(self) -> Sequence[str]:
        """The archs its per-target stages run for."""
        ...

    @property
    def parts(self) -> tuple[str, ...]:
        """The model parts its per-part stages run for (``llm``, and ``visual`` for a VL model's encoder)."""
        ...

    @property
    def source(self) -> ModelSource: ...

    @property
    def lock_path(self) -> Path:
        """Where a remote source's resolved revision is pinned."""
        ...

    def local_dir(self) -> Path:
        """A local source's directory."""
        ...


@dataclass(frozen=True)
class Models:
    """How a chain finds the models it builds."""

    discover: Callable[[list[Path], dict[Path, SpecError]], Mapping[str, Model]]
    """``(spec dirs, bad) -> {name: model}``; a spec that does not load goes into ``bad`` (by path), the rest load."""
    declared_name: Callable[[Path], str | None]
    """The name a spec file gives its model, read without validating it (None: unreadable): a command that names a
    model whose spec did not load fails with that spec's error."""
