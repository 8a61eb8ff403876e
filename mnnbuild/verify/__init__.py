"""Helpers of the verify stage: numeric comparison, the checks, and the report (see ``mnnbuild.stages.verify``).

The runtime verify runs bundles with (``mnnbuild_runtime``) is in the stage's key through the code fingerprint
(`mnnbuild.pipeline.fingerprint`), which covers what a stage imports of both packages.
"""
