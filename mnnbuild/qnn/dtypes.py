"""QNN data type and tensor type codes, and their numpy equivalents."""

from __future__ import annotations

import numpy as np

from mnnbuild.base.errors import QnnError

# Qnn_DataType_t
INT_8 = 0x0008
INT_16 = 0x0016
INT_32 = 0x0032
INT_64 = 0x0064
UINT_8 = 0x0108
UINT_16 = 0x0116
UINT_32 = 0x0132
UINT_64 = 0x0164
FLOAT_16 = 0x0216
BFLOAT_16 = 0x0226
FLOAT_32 = 0x0232
FLOAT_64 = 0x0264
SFIXED_POINT_4 = 0x0304
SFIXED_POINT_8 = 0x0308
SFIXED_POINT_16 = 0x0316
SFIXED_POINT_32 = 0x0332
UFIXED_POINT_4 = 0x0404
UFIXED_POINT_8 = 0x0408
UFIXED_POINT_16 = 0x0416
UFIXED_POINT_32 = 0x0432
BOOL_8 = 0x0508
UNDEFINED = 0x7FFFFFFF

# Qnn_TensorType_t
TENSOR_APP_WRITE = 0
TENSOR_APP_READ = 1
TENSOR_APP_READWRITE = 2
TENSOR_NATIVE = 3
TENSOR_STATIC = 4
TENSOR_NULL = 5

DTYPE_NAMES: dict[int, str] = {
    INT_8: "int8",
    INT_16: "int16",
    INT_32: "int32",
    INT_64: "int64",
    UINT_8: "uint8",
    UINT_16: "uint16",
    UINT_32: "uint32",
    UINT_64: "uint64",
    FLOAT_16: "float16",
    BFLOAT_16: "bfloat16",
    FLOAT_32: "float32",
    FLOAT_64: "float64",
    SFIXED_POINT_4: "sfixed4",
    SFIXED_POINT_8: "sfixed8",
    SFIXED_POINT_16: "sfixed16",
    SFIXED_POINT_32: "sfixed32",
    UFIXED_POINT_4: "ufixed4",
    UFIXED_POINT_8: "ufixed8",
    UFIXED_POINT_16: "ufixed16",
    UFIXED_POINT_32: "ufixed32",
    BOOL_8: "bool",
}
NAME_TO_DTYPE = {v: k for k, v in DTYPE_NAMES.items()}

# numpy storage type for every QNN type whose elements are whole bytes.
_STORAGE: dict[int, np.dtype] = {
    INT_8: np.dtype(np.int8),
    INT_16: np.dtype(np.int16),
    INT_32: np.dtype(np.int32),
    INT_64: np.dtype(np.int64),
    UINT_8: np.dtype(np.uint8),
    UINT_16: np.dtype(np.uint16),
    UINT_32: np.dtype(np.uint32),
    UINT_64: np.dtype(np.uint64),
    FLOAT_16: np.dtype(np.float16),
    FLOAT_32: np.dtype(np.float32),
    FLOAT_64: np.dtype(np.float64),
    SFIXED_POINT_8: np.dtype(np.int8),
    SFIXED_POINT_16: np.dtype(np.int16),
    SFIXED_POINT_32: np.dtype(np.int32),
    UFIXED_POINT_8: np.dtype(np.uint8),
    UFIXED_POINT_16: np.dtype(np.uint16),
    UFIXED_POINT_32: np.dtype(np.uint32),
    BOOL_8: np.dtype(np.bool_),
}
_FROM_NUMPY: dict[np.dtype, int] = {
    np.dtype(np.int8): INT_8,
    np.dtype(np.int16): INT_16,
    np.dtype(np.int32): INT_32,
    np.dtype(np.int64): INT_64,
    np.dtype(np.uint8): UINT_8,
    np.dtype(np.uint16): UINT_16,
    np.dtype(np.uint32): UINT_32,
    np.dtype(np.uint64): UINT_64,
    np.dtype(np.float16): FLOAT_16,
    np.dtype(np.float32): FLOAT_32,
    np.dtype(np.float64): FLOAT_64,
    np.dtype(np.bool_): BOOL_8,
}
QUANTIZED = {
    SFIXED_POINT_8,
    SFIXED_POINT_16,
    SFIXED_POINT_32,
    UFIXED_POINT_8,
    UFIXED_POINT_16,
    UFIXED_POINT_32,
    SFIXED_POINT_4,
    UFIXED_POINT_4,
}


def qnn_dtype(dtype: int | str | np.dtype | type) -> int:
    """A QNN data type code from a code, a name (``"float32"``, ``"ufixed8"``) or a numpy dtype."""
    if isinstance(dtype, int):
        if dtype not in DTYPE_NAMES:
            raise QnnError(f"unknown QNN data type code {dtype:#x}")
        return dtype
    if isinstance(dtype, str) and dtype in NAME_TO_DTYPE:
        return NAME_TO_DTYPE[dtype]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise QnnError(f"unknown data type {dtype!r}") from None
    if np_dtype not in _FROM_NUMPY:
        raise QnnError(f"numpy dtype {np_dtype} has no QNN equivalent")
    return _FROM_NUMPY[np_dtype]


def numpy_dtype(code: int) -> np.dtype:
    """The numpy type that stores elements of QNN type ``code``."""
    if code not in _STORAGE:
        raise QnnError(f"QNN data type {DTYPE_NAMES.get(code, hex(code))} has no numpy storage type")
    return _STORAGE[code]


def dtype_name(code: int) -> str:
    return DTYPE_NAMES.get(code, f"{code:#x}")
