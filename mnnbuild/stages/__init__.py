"""The stages of the chain, one module each: fetch, io, partition, config, context, bundle; twin and verify, which
prove the bundle; report; and modellib, the model-lib for QNN tools, which no bundle needs (context and twin lower
the partition's graphs themselves).

A stage module holds its entry function ``(inputs, params, out_dir) -> Manifest`` and ends with its
``STAGE`` declaration (`mnnbuild.pipeline.stage.Stage`). Stages never import each other: what they share (the
Inputs / Params / Manifest models) lives in `mnnbuild.manifests`, and artifact names in `mnnbuild.pipeline.layout`,
so a stage's code fingerprint covers its own code and the library code it calls. This package imports
nothing, so importing one stage does not pull in the others.
"""
