"""Task keys: what a stage's result depends on besides its input files' content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mnnbuild.pipeline.fingerprint import DigestMemo, code_fingerprint
from mnnbuild.pipeline.manifest import Manifest


def input_identity(inputs: BaseModel) -> dict[str, Any]:
    """The inputs' fields that say *what* is built (model, binary, graph names), not *where* from.

    Paths are left out: the content behind them enters the key through the input files' hashes,
    and leaving locations out lets a checkout elsewhere hit the same cache entries.
    """

    def is_location(value: Any) -> bool:
        return isinstance(value, Path) or (
            isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Path) for v in value)
        )

    fields = {name: getattr(inputs, name) for name in type(inputs).model_fields}
    return {name: v for name, v in inputs.model_dump(mode="json").items() if not is_location(fields[name])}


def stage_key(
    stage_module: str,
    manifest: type[Manifest],
    inputs: BaseModel,
    params: BaseModel,
    tools: dict[str, str],
    memo: DigestMemo | None = None,
    reads: dict[str, str] | None = None,
) -> str:
    """What a stage's result depends on besides its input files' content, as one string for doit.

    The code is the stage's own (other stages are not imported), so an upstream edit reaches a
    downstream stage only through the upstream outputs: when they come out identical, it stays up to date.
    ``reads``: upstream files the stage reads by their manifest's record (``<stage>/<path>`` -> sha256), in the key
    as their content would be through the file_dep.
    """
    code = code_fingerprint(stage_module, memo)
    schema = manifest.schema_hash(memo)
    if memo is not None:
        memo.save()
    return json.dumps(
        {
            "code": code,
            "schema": schema,
            "inputs": input_identity(inputs),
            "params": params.model_dump(mode="json"),
            "tools": tools,
            **({"reads": reads} if reads else {}),
        },
        sort_keys=True,
    )
