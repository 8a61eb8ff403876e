"""The committed schema and generated code: positional values MNN files depend on, and the
generated helpers staying in sync."""

from __future__ import annotations

import inspect
import re

import pytest

from mnnbuild.mnn import OP_TYPES, PARAM_TYPES, schema
from mnnbuild.mnn._generated import mnn_fb
from mnnbuild.mnn._generated.vector_types import VECTOR_DTYPES
from mnnbuild.mnn.regen_schema import SCHEMA_DIR, patch_generated, vector_dtypes

# values fixed by MNN's schema (enum/union members are positional; a reorder would corrupt every file)
EXPECTED_OP_TYPES = {
    "BinaryOp": 7, "Cast": 9, "Concat": 10, "Const": 11, "Convolution": 12, "Unique": 24, "GatherV2": 31,
    "Input": 34, "MatMul": 39, "NonMaxSuppressionV2": 42, "Permute": 46, "Rank": 66, "Reshape": 73,
    "Shape": 80, "Softmax": 85, "Segment": 89, "Squeeze": 90, "StridedSlice": 91, "UnaryOp": 101,
    "Where": 103, "Unsqueeze": 107, "Raster": 128, "ConvertTensor": 129, "Plugin": 256, "Attention": 299,
    "Extra": 512, "While": 600, "If": 601, "LayerNorm": 603, "GridSample": 604,
}  # fmt: skip
EXPECTED_PARAM_TAGS = {
    "QuantizedAdd": 1, "Axis": 4, "BinaryOp": 6, "Blob": 7, "CastParam": 8, "Convolution2D": 9,
    "GatherV2": 19, "Input": 21, "MatMul": 25, "Permute": 29, "Plugin": 30, "Reshape": 55,
    "SqueezeParam": 64, "StridedSliceParam": 65, "TensorConvertInfo": 66, "UnaryOp": 70, "Extra": 78,
    "LayerNorm": 88, "AttentionParam": 98,
}  # fmt: skip


def test_positional_values_match_mnn() -> None:
    for name, value in EXPECTED_OP_TYPES.items():
        assert OP_TYPES[name] == value, name
    for name, value in EXPECTED_PARAM_TAGS.items():
        assert PARAM_TYPES[name] == value, name
    assert schema.DataType.DT_FLOAT == 1 and schema.DataType.DT_INT32 == 3 and schema.DataType.DT_HALF == 19
    assert schema.MNN_DATA_FORMAT.NC4HW4 == 2
    assert schema.BinaryOpOperation.MUL == 2 and schema.UnaryOpOperation.SIN == 9


def test_every_union_member_has_an_object_class() -> None:
    for name, tag in PARAM_TYPES.items():
        if tag:
            assert hasattr(mnn_fb, name + "T"), name


def test_vector_dtypes_in_sync_with_generated_code() -> None:
    source = inspect.getsource(mnn_fb)
    assert vector_dtypes(source) == VECTOR_DTYPES
    assert VECTOR_DTYPES["OpT"] == {"inputIndexes": "<i4", "outputIndexes": "<i4"}
    assert VECTOR_DTYPES["Convolution2DT"]["external"] == "<i8"


def test_generated_code_carries_the_type_shadowing_patch() -> None:
    source = inspect.getsource(mnn_fb)
    assert "_builtin_type = type" in source
    assert not re.search(r"(?<![\w.])type\(self\.", source)
    raw = source.replace("_builtin_type(self.", "type(self.").replace("_builtin_type = type\n", "")
    assert patch_generated(raw) == source


def test_schema_files_are_packaged() -> None:
    names = sorted(p.name for p in SCHEMA_DIR.glob("*.fbs"))
    assert "mnn.fbs" in names and "tensor.fbs" in names and "caffe_op.fbs" in names
    assert "root_type Net;" in (SCHEMA_DIR / "mnn.fbs").read_text()


def test_import_time_enums_in_sync_with_generated_code() -> None:
    from mnnbuild.mnn._generated import enums
    from mnnbuild.mnn.regen_schema import IMPORT_TIME_ENUMS

    for const, cls in IMPORT_TIME_ENUMS.items():
        generated = getattr(mnn_fb, cls)
        members = {k: v for k, v in vars(generated).items() if not k.startswith("_") and isinstance(v, int)}
        assert getattr(enums, const) == members, const


@pytest.mark.slow
def test_doit_start_runs_neither_the_schema_module_nor_the_c_parser() -> None:
    # both cost ~0.4 s at every doit start and in every context process, without a model being read
    import subprocess
    import sys

    code = (
        # what dodo.py imports; the schema module is absent or a lazy module until first use
        "import sys, types, mnnbuild.dag, mnnbuild.stages.chain, mnnbuild.qnn.library\n"
        "fb = sys.modules.get('mnnbuild.mnn._generated.mnn_fb')\n"
        "print(type(fb) is types.ModuleType, 'pycparser' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["False", "False"]
    from mnnbuild.mnn import load_model  # and the lazy module does load on use

    assert load_model.__module__ == "mnnbuild.mnn.model" and mnn_fb.OpType.Plugin == OP_TYPES["Plugin"]
