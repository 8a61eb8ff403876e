"""config: ``config_qnn.json``, the runtime config the phone's ``llm_demo`` is started with.

It is written from scratch, not derived from the model's ``config.json``: the outer graph runs on MNN's CPU
backend, which loads the QNN plugins. The model entries follow the model part (``mnnbuild.modeldir.ModelPart``)
as upstream's ``output_qnn`` writes them: ``llm_model = "qnn/<graph file>"``, ``llm_weight`` (written only when
it is not MNN's default ``llm.mnn.weight``, e.g. ``embedding.mnn.weight``) and ``chunk_limits``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mnnbuild.fsutil import atomic_write_text, staged_dir
from mnnbuild.layout import CONFIG_FILE, DEFAULT_TOKENIZER
from mnnbuild.manifest import FileRecord, record_outputs, tool_versions
from mnnbuild.manifests.config import ConfigInputs, ConfigManifest, ConfigParams, ConfigQnn
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.modeldir import MNN_DEFAULT_WEIGHT, tokenizer_file
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def write_config(inputs: ConfigInputs, params: ConfigParams, out_dir: Path) -> ConfigManifest:
    """Write ``config_qnn.json`` with every prefill length and decode (1) as chunk limits, and the tokenizer file."""
    fetched = inputs.manifest(FetchManifest, inputs.model_dir)
    tokenizer = tokenizer_file(inputs.model_dir)
    part = fetched.part
    config = ConfigQnn(
        llm_model=part.result_model,
        llm_weight=None if part.weight_file == MNN_DEFAULT_WEIGHT else part.weight_file,
        chunk_limits=[*params.chunk_sizes, 1],
        tokenizer_file=None if tokenizer == DEFAULT_TOKENIZER else tokenizer,
        visual_model=params.visual_model,
    )
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / CONFIG_FILE, config.to_json())
        manifest = ConfigManifest(
            model=inputs.model,
            target=inputs.target,
            inputs=[
                FileRecord(path=f"model/{r.path}", size=r.size, sha256=r.sha256)
                for r in fetched.outputs
                if r.path == tokenizer
            ],
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            config=config,
        )
        manifest.write(tmp)
    log.info(
        "config %s-%s: %s, chunk_limits %s, tokenizer %s",
        inputs.model, inputs.target, config.llm_model, config.chunk_limits, tokenizer,
    )  # fmt: skip
    return manifest


STAGE = Stage(
    name="config",
    entry=write_config,
    inputs=ConfigInputs,
    params=ConfigParams,
    manifest=ConfigManifest,
    upstream=("fetch",),
    outputs=(CONFIG_FILE,),
    per_target=True,
    doc="Write each model's config_qnn.json per target.",
)
