"""Generated code (see mnnbuild/qnn/regen_ffi.py)."""
