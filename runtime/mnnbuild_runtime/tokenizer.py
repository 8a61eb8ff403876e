"""Text <-> token ids with MNN's own tokenizer (PyPI ``MNN.llm``), for prompts of greedy generation."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.base.native import native_output
from mnnbuild.cpu import import_mnn
from mnnbuild.mnn.tokenizer import check_tokenizer
from mnnbuild_runtime.bundle import bundle_path, check_engine_files, read_config
from mnnbuild_runtime.errors import BundleError


class Tokenizer:
    """The tokenizer of a model dir or bundle, given its config (``config.json`` or ``config_qnn.json``).

    PyPI MNN exposes the tokenizer only through an ``Llm`` object, which must be ``load()``-ed first;
    loading reads the model graph and weights but runs nothing, so it also works for a bundle whose
    ``qnn/llm.mnn`` has Plugin ops. Only ``tokenizer_encode``/``tokenizer_decode`` are used.
    """

    def __init__(self, config: str | os.PathLike[str], *, links: bool = False) -> None:
        """``links``: the config of a fetched model dir, whose files are links to the source model's (`bundle_path`);
        a bundle's are copies."""
        path = Path(config)
        if not path.is_file():
            raise BundleError(f"{path}: config file missing; expected config.json or config_qnn.json of a model dir")
        # MNN's engine reads every file it names: none may lie outside the model dir
        config_data = read_config(path, links=links)
        # MNN crashes (SIGSEGV in tokenizer_encode) instead of failing when the tokenizer file is missing
        name = config_data.get("tokenizer_file", "tokenizer.txt")
        tok_file = bundle_path(path.parent, name, f"{path}: field 'tokenizer_file'", links=links)
        if not tok_file.is_file():
            raise BundleError(
                f"{path}: tokenizer file {tok_file} (field 'tokenizer_file', default 'tokenizer.txt') does not exist"
            )
        try:  # MNN's engine crashes on a tokenizer it cannot read (SIGSEGV, nothing printed)
            check_tokenizer(tok_file)
        except MNNFormatError as exc:
            raise BundleError(str(exc)) from None
        import_mnn()
        check_engine_files(path, config_data, links=links)  # MNN opens them by name: checked right before
        with native_output(f"MNN's tokenizer ({path})"):  # MNN prints progress on stdout
            import MNN.llm  # never MNN.tools: it installs packages and sends telemetry

            self._llm: Any = MNN.llm.create(str(path))
            self._llm.load()
        self.config = path

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._llm.tokenizer_encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._llm.tokenizer_decode(int(t)) for t in ids)
