"""Conformance: build MNN's own runtime and run bundles through its ``Llm`` engine (issue 13).

Not part of the doit DAG or CI: it needs an MNN source and QNN headers from the user and a ~15-minute
build (cached per machine, outside the project). ``python -m mnnbuild conform <model>-<arch>``.
"""
