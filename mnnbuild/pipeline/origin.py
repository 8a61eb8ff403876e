"""A stage dir's origin record: how it came to be (built or restored), beside its manifest, outside its content;
the stamps of its outputs when they were hashed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mnnbuild.base.fsutil import (
    atomic_write_text,
    file_stamp,
    parse_json,
)
from mnnbuild.pipeline.layout import origin_file


def read_origin(out_dir: Path, stage: str) -> dict[str, Any]:
    """A stage dir's origin record (`write_origin`), or {} when it has none that parses."""
    try:
        origin = parse_json((Path(out_dir) / origin_file(stage)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return origin if isinstance(origin, dict) else {}


def stamps(out_dir: Path, paths: list[str]) -> dict[str, list[int]]:
    """The `file_stamp` of each output just hashed (built, or restored and checked), for the origin record: a file
    with the same stamp later still has the recorded sha256 (`trusted_hashes`), so verify need not hash it again."""
    found = {}
    for rel in paths:
        stamp = file_stamp(Path(out_dir) / rel)
        if stamp is not None:
            found[rel] = stamp
    return found


def trusted_hashes(out_dir: Path, stage: str) -> dict[str, list[int]]:
    """The stamps the origin record holds: outputs hashed when the stage dir was made (`stamps`)."""
    found = read_origin(out_dir, stage).get("stamps")
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 4}


def write_origin(out_dir: Path, stage: str, origin: dict[str, Any]) -> None:
    """Record how a stage dir came to be (built or restored), beside its manifest, outside its content.

    Written to a temp name and renamed, never in place: the name could be a hard link to a cache blob."""
    atomic_write_text(Path(out_dir) / origin_file(stage), json.dumps(origin, indent=2, sort_keys=True) + "\n")
