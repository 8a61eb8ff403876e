"""verify: prove a bundle works by running it the way the phone does, and say how well.

Checks (tolerances in :class:`VerifyParams`):

- bundle integrity: every bundle file against the bundle manifest (size, sha256);
- plugins: each shipped ``qnn/graphllm<k>.bin`` has the hash the context stage recorded and, through QnnSystem
  binary info, exactly the graphs, tensor names, shapes and SoC/arch its Plugin op expects;
- (a) per graph: the graph in the x86 HTP simulator vs its source ops in MNN on the same inputs (those the
  whole-model pass fed it; for a graph no pass ran, the partition's reference inputs and outputs);
- (b) whole model: the bundle (CPU segments in MNN, plugins in the simulator) vs the original model's CPU
  outputs (the io stage's samples), decode and prefill, with top-1 agreement of the logits rows;
  a VL model's encoder (``qnn/visual.mnn``, its visual part) gets the plugin, per-graph and whole-encoder checks
  too, at every image size (its io samples);
- (c) generation: the bundle's greedy pick and logits vs MNN CPU's on the original model at every step of MNN's own
  greedy tokens for the same prompt (models that generate: not an embedding model, whose whole-model check compares
  ``sentence_embeddings`` by cosine and error);
- speculation, for a bundle whose config asks for it (``speculative_type`` "eagle" or "lookahead"): for Eagle the
  engine's verifying forward on a real draft tree against the CPU; for both the bundle's speculative greedy tokens
  (Eagle draft or n-gram drafts) against the CPU's plain greedy ones (`mnnbuild.verify.speculation`), with the mean
  accepted tokens per forward and NPU weight bytes per token.

The x86 library cannot load weight-shared binaries, so the simulator runs the unshared twins the twin stage
built from the same graphs and weights (``mnnbuild.verify.checks``); the report says per plugin which binary ran.
The simulator work is one pass: the io samples and the generation sequence run through the bundle in lockstep
with at most ``max_loaded_plugins`` contexts loaded, and its executions serve the per-graph checks too. Where a
prefill sample has the generation's length, one run serves both checks (``GenerationRun.share``). The generation
runs on MNN's own greedy tokens (its KV-cache engine's) and each step is compared with the original model's
recompute forward on the same tokens, so the pass never runs twice; a big model's CPU reference runs in a child
process beside the pass (`mnnbuild.verify.reference`); no
file the bundle or twin stage hashed, unchanged since, is hashed again (`mnnbuild_runtime.hashes`). The report's
``timings`` say where each second went.

Writes ``verify.json`` (:class:`~mnnbuild.verify.verdict.VerifyReport`) and ``verify.txt``. On any failed check
the report is still written (so it can be read), but without ``verify.manifest.json``, the task's target:
a failed verify never looks done, and the stage raises a ``ToleranceError`` naming the worst failure.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from mnnbuild.base.errors import ToleranceError
from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.verify import VerifyInputs, VerifyManifest, VerifyParams
from mnnbuild.model.spec import ModelSpec
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR
from mnnbuild.pipeline.layout import VERIFY_REPORT_JSON as REPORT_JSON
from mnnbuild.pipeline.layout import VERIFY_REPORT_TEXT as REPORT_TEXT
from mnnbuild.pipeline.manifest import FileRecord, record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage

log = logging.getLogger(__name__)


def verify(inputs: VerifyInputs, params: VerifyParams, out_dir: Path) -> VerifyManifest:
    """Run every check and write the report; raise ``ToleranceError`` (after writing it) when a check failed."""
    from mnnbuild.verify.run import parts, run_checks
    from mnnbuild.verify.verdict import format_report

    out_dir = Path(out_dir)
    bundle = inputs.manifest(BundleManifest, inputs.bundle_dir)
    upstream = [
        (d, m)
        for part in parts(inputs)
        for d, m in (
            (part.partition_dir, PartitionManifest),
            (part.io_dir, IoManifest),
        )
    ]
    for d, m in upstream:
        inputs.manifest(m, Path(d))  # a missing or stale upstream manifest is an error, not a failed check
    report = run_checks(inputs, params, out_dir)
    graph_checks = [t for g in report.graphs for t in g.outputs]
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / REPORT_JSON, report.model_dump_json(indent=2) + "\n")
        atomic_write_text(tmp / REPORT_TEXT, format_report(report))
        manifest = None
        if report.passed:
            manifest = VerifyManifest(
                model=inputs.model,
                target=params.soc.dsp_arch,
                inputs=[r.under("bundle") for r in bundle.outputs if r.path.startswith("model/")],
                params=params,
                tools=tool_versions(mnn=True, qnn=report.qnn.get("build_id")),
                outputs=record_outputs(tmp),
                passed=True,
                executed={p.path: p.executed or "not run" for p in report.plugins},
                worst_graph_cosine=min((t.cosine for t in graph_checks if t.cosine is not None), default=None),
                worst_graph_rel_err=max((t.rel_err for t in graph_checks if t.rel_err is not None), default=None),
                tokens_match=None if report.generation is None else report.generation.first_divergence is None,
            )
            manifest.write(tmp)
    text = out_dir / REPORT_TEXT
    if manifest is None:
        # one line: the worst failure of the first kind that failed (integrity, structure, graphs, model, generation)
        more = len(report.failures) - 1
        raise ToleranceError(
            f"verify {inputs.model}-{params.soc.dsp_arch} FAILED: {report.headline[0]}"
            + (f" (and {more} more failed check{'s' if more > 1 else ''})" if more else "")
            + f"; read {text}"
        )
    log.debug("verify %s-%s passed: %s", inputs.model, params.soc.dsp_arch, text)
    return manifest


def integrity_passed(bundle_dir: Path, records: list[FileRecord], trusted: Mapping[str, list[int]]) -> bool:
    """`mnnbuild.verify.checks.integrity_passed`, imported when a verify task is checked (not at every doit start)."""
    from mnnbuild.verify import checks

    return checks.integrity_passed(bundle_dir, records, trusted)


def verify_params(spec: ModelSpec, at: At) -> VerifyParams:
    return VerifyParams(
        soc=spec.soc(str(at.arch)),
        max_new_tokens=spec.verify.max_new_tokens,
        follow_divergence=spec.verify.follow_divergence,
    )


def describe(spec: ModelSpec, at: At) -> str:
    return f"check the {spec.name} bundle for {spec.soc(str(at.arch)).name}: CPU in MNN, plugins in the HTP simulator"


STAGE = Stage(
    entry=verify,
    params_of=verify_params,
    describe=describe,
    placement="target",
    default=True,
    outputs=(REPORT_JSON, REPORT_TEXT),
    tools=frozenset({"MNN", "QNN"}),
    guards={"bundle_dir": BUNDLE_MODEL_DIR},
    intact=integrity_passed,
    leaves_on_failure=REPORT_JSON,
    group_default_only=True,
    doc=(
        "Verify the default bundles (what a bare `doit` runs; `verify:<model>-<arch>`: any other): run a "
        "bundle on MNN's CPU and the HTP simulator and compare."
    ),
)
