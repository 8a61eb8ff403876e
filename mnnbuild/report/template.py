"""Where the page's template lives and a fingerprint of what draws it, importable without Jinja2 or matplotlib
(the DAG keys the report task with it at every doit start)."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "report.html.j2"


def renderer_fingerprint() -> str:
    """The template's content and the versions of the libraries that draw the page: a change re-makes it
    (the stage code fingerprint sees Python modules only)."""
    digest = hashlib.sha256()
    for path in sorted(TEMPLATES.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(TEMPLATES).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    versions = " ".join(f"{name} {metadata.version(name)}" for name in ("jinja2", "matplotlib"))
    digest.update(versions.encode())
    return digest.hexdigest()[:16]
