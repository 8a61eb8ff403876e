"""report: one self-contained HTML page per verified (or failed) bundle that a reviewer reads in a minute.

Reads verify's ``verify.json`` (written on success and on failure: a failed verify has no manifest, and its
page then opens with the failures), the partition's ``partition.json`` and decode graph records (the op
strip), the bundle manifest (sha256 list, sizes) and every stage's manifest and origin record (cost), and
writes ``index.html``: styles and SVG figures inline, nothing fetched when it is viewed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from mnnbuild.base.errors import MnnbuildError, StageError, UpstreamError, field_problems
from mnnbuild.base.fsutil import atomic_write_text, confined, staged_dir
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.config import ConfigManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.report import ReportInputs, ReportManifest, ReportParams
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.manifests.verify import VerifyManifest
from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.model.spec import ModelSpec
from mnnbuild.pipeline.layout import PARTITION_REPORT_JSON as PARTITION_JSON
from mnnbuild.pipeline.layout import QNN_DIR, REPORT_PAGE, plugin_context_dir
from mnnbuild.pipeline.layout import VERIFY_REPORT_JSON as VERIFY_JSON
from mnnbuild.pipeline.manifest import FileRecord, Manifest, record_outputs, tool_versions
from mnnbuild.pipeline.origin import read_origin
from mnnbuild.pipeline.stage import At, Ending, Stage

if TYPE_CHECKING:
    from mnnbuild.report import ReportData, StageCost

log = logging.getLogger(__name__)


def _read_json_model(path: Path, model: type[BaseModel], what: str) -> BaseModel:
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"{path}: {what} missing; run the {what.split('.')[0]} stage first") from None
    except (OSError, ValueError, ValidationError) as exc:
        raise StageError(f"{path}: not a valid {what}: {field_problems(exc)}") from None


def _cost(stage: str, label: str, stage_dir: Path, manifest: type[Manifest], run: object) -> StageCost:
    from mnnbuild.report import StageCost

    origin = read_origin(stage_dir, stage)
    outputs: list[FileRecord] = []
    try:
        outputs = manifest.read(stage_dir).outputs
    except UpstreamError:  # no manifest (not built, or a failed verify), or one that is no longer valid
        if origin.get("origin") != "failed":
            return StageCost(stage=stage, label=label, status="missing")
    how = {"built": "built", "cache": "from cache", "failed": "failed"}.get(str(origin.get("origin")), "unknown")
    status = how if how == "failed" or (run is not None and origin.get("run") == run) else "up to date"
    seconds, peak = origin.get("seconds"), origin.get("peak_rss")
    return StageCost(
        stage=stage,
        label=label,
        status=status if origin else "unknown",
        at=str(origin["at"]) if "at" in origin else None,
        seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        peak_rss=int(peak) if isinstance(peak, int) else None,
        bytes_written=sum(r.size for r in outputs),
        files=len(outputs),
    )


def gather(inputs: ReportInputs, params: ReportParams, page_dir: Path) -> ReportData:
    """Everything the page shows, read from the stage dirs; bad or missing records name their file. Paths on the
    page are relative to ``page_dir`` (where it goes): right in any artifact root it is restored into."""
    from mnnbuild.partition.records import PartitionReport, SubgraphRecord
    from mnnbuild.report import OpCell, ReportData
    from mnnbuild.report.data import op_strip
    from mnnbuild.verify.verdict import VerifyReport

    verify_dir = Path(inputs.verify_dir)
    verify_report = _read_json_model(verify_dir / VERIFY_JSON, VerifyReport, VERIFY_JSON)
    assert isinstance(verify_report, VerifyReport)
    partition_dir = Path(inputs.partition_dir)
    partition_report = _read_json_model(partition_dir / PARTITION_JSON, PartitionReport, PARTITION_JSON)
    assert isinstance(partition_report, PartitionReport)
    plugin_cells = []
    for plugin in partition_report.plugins:
        record = SubgraphRecord.read(plugin_graph_dir(partition_dir, plugin.name, plugin.graphs))
        plugin_cells += [OpCell(index=op.index, name=op.name, type=op.type, where=plugin.name) for op in record.ops]
    bundle = BundleManifest.read(Path(inputs.bundle_dir))
    prefix = f"model/{bundle.model_name}/"
    binaries = {r.path[len(prefix) :]: r.size for r in bundle.outputs if r.path.startswith(prefix + QNN_DIR + "/")}

    run = read_origin(verify_dir, "verify").get("run")
    stages: list[tuple[str, str, Path, type[Manifest]]] = [
        ("fetch", "fetch", Path(inputs.model_dir), FetchManifest),
        ("io", "io", Path(inputs.io_dir), IoManifest),
        ("partition", "partition", partition_dir, PartitionManifest),
        ("config", "config", Path(inputs.config_dir), ConfigManifest),
        *(
            ("context", f"context {Path(p.name).stem}", plugin_context_dir(inputs.context_dir, p.name), ContextManifest)
            for p in partition_report.plugins
        ),
        ("bundle", "bundle", Path(inputs.bundle_dir), BundleManifest),
        # verify's unshared twins: a build cost of verifying, not of the bundle
        *(
            ("twin", f"twin {Path(p.name).stem}", plugin_context_dir(inputs.twin_dir, p.name), TwinManifest)
            for p in partition_report.plugins
        ),
        ("verify", "verify", verify_dir, VerifyManifest),
    ]
    return ReportData(
        model=inputs.model,
        target=params.target,
        verify=verify_report,
        partition=partition_report,
        ops=op_strip(partition_report, plugin_cells),
        plugin_binaries=binaries,
        bundle_files=list(bundle.outputs),  # every file the integrity check counts, the scripts included
        bundle_path=os.path.relpath(os.path.abspath(Path(inputs.bundle_dir) / prefix), os.path.abspath(page_dir)),
        bundle_qnn_build=bundle.qnn_build,
        plugin_weights=_plugin_weights(Path(inputs.context_dir), [p.name for p in partition_report.plugins]),
        costs=[_cost(stage, label, d, m, run) for stage, label, d, m in stages],
    )


def plugin_graph_dir(partition_dir: Path, plugin: str, graphs: list[str]) -> Path:
    """The dir of a plugin's first graph, as partition.json names it (``graphllm0``, in the partition's ``qnn/``)."""
    where = f"{partition_dir / PARTITION_JSON}: plugin {plugin!r} field 'graphs'"
    if not graphs:
        raise StageError(f"{where} lists no graph; run the partition stage again")
    return confined(partition_dir / QNN_DIR, graphs[0], where)


def _plugin_weights(context_dir: Path, plugins: list[str]) -> dict[str, list[WeightNote]]:
    """Each plugin's weight notes from its context manifest (none where the manifest is missing or older)."""
    found: dict[str, list[WeightNote]] = {}
    for plugin in plugins:
        try:
            found[plugin] = ContextManifest.read(plugin_context_dir(context_dir, plugin)).weights
        except MnnbuildError:
            continue
    return found


def report(inputs: ReportInputs, params: ReportParams, out_dir: Path) -> ReportManifest:
    """Write ``index.html`` (and the manifest) for the bundle verify last checked, passed or failed."""
    out_dir = Path(out_dir)
    from mnnbuild.report.render import render_html  # Jinja2: loaded only to draw a page

    data = gather(inputs, params, out_dir)
    page = render_html(data)
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / REPORT_PAGE, page)
        manifest = ReportManifest(
            model=inputs.model,
            target=params.target,
            inputs=[FileRecord.of(Path(inputs.verify_dir) / VERIFY_JSON, Path(inputs.verify_dir).parent)],
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            verify_passed=data.verify.passed,
        )
        manifest.write(tmp)
    log.debug("report %s-%s: %s", inputs.model, params.target, out_dir / REPORT_PAGE)
    return manifest


def report_params(spec: ModelSpec, at: At) -> ReportParams:
    return ReportParams(target=str(at.arch))


def describe(spec: ModelSpec, at: At) -> str:
    return f"the {spec.name} {at.arch} bundle's page report: verdict, partition, numbers, cost ({REPORT_PAGE})"


def renderer_versions() -> dict[str, str]:
    """The template and the libraries that draw the page are not Python modules of ours: keyed explicitly."""
    from mnnbuild.report import renderer_fingerprint

    return {"report_renderer": renderer_fingerprint()}


STAGE = Stage(
    entry=report,
    params_of=report_params,
    describe=describe,
    placement="target",
    default=True,
    outputs=(REPORT_PAGE,),
    ending=Ending(page=REPORT_PAGE),
    versions=renderer_versions,
    after_failure_of="verify",
    doc=(
        "Page reports, one HTML page per verified bundle: the verdict, the partition, the numbers and the "
        "cost (created after the model's partition)."
    ),
)
