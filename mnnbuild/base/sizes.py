"""Byte sizes as people write and read them, through pydantic's ``ByteSize`` (one unit family: KiB, MiB, GiB)."""

from __future__ import annotations

from pydantic import ByteSize, TypeAdapter, ValidationError

from mnnbuild.base.errors import MnnbuildError

_SIZE = TypeAdapter(ByteSize)


def human_bytes(n: float) -> str:
    """``3774873`` -> ``3.6 MiB``."""
    return ByteSize(max(int(n), 0)).human_readable(separator=" ")


def parse_size(text: str, what: str = "--max-size") -> int:
    """``20GiB``, ``500MB``, ``1048576`` -> bytes (``G``/``GB`` decimal, ``GiB`` binary, as ``ByteSize`` reads
    them): a size of at least one byte below 2**63, or a one-line `MnnbuildError` naming ``what``."""
    expected = "expected a size above 0 such as 20GiB, 500MB or 1048576"
    try:
        size = int(_SIZE.validate_python(text))
    except ValidationError:
        raise MnnbuildError(f"{what} {text!r}: not a size; {expected}") from None
    if size >= 1 << 63:
        raise MnnbuildError(f"{what} {text!r}: too large; {expected}")
    if size < 1:
        raise MnnbuildError(f"{what} {text!r}: zero; {expected}")
    return size
