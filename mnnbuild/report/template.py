"""Where the page's template lives and a fingerprint of what draws it, importable without Jinja2
(the DAG keys the report task with it at every doit start)."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "report.html.j2"


def renderer_fingerprint() -> str:
    """The template's content and the version of Jinja2, which renders it: a change re-makes the page (the stage
    code fingerprint sees Python modules only; the figures are drawn by our own :mod:`mnnbuild.report.svg`)."""
    digest = hashlib.sha256()
    for path in sorted(TEMPLATES.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(TEMPLATES).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"jinja2 {metadata.version('jinja2')}".encode())
    return digest.hexdigest()[:16]
