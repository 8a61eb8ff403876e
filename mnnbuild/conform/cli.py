"""``python -m mnnbuild conform <model>-<arch>``: build MNN's runtime (once) and run the conformance check.

A command, not a doit task: it needs inputs the DAG does not have (an MNN source and QNN headers named by
the user), a per-machine build outside the artifact root, and a long first build; it must stay out of
a bare ``doit`` and of CI. It reads the DAG's outputs (bundle, partition, the fetched model) and
says which ``doit`` task to run when one is missing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from mnnbuild.base.errors import MnnbuildError, Unavailable
from mnnbuild.conform.boundaries import compare_boundaries
from mnnbuild.conform.build import ensure_build, ensure_driver, resolve_qnn_headers, resolve_source
from mnnbuild.conform.effect import default_lengths
from mnnbuild.conform.patcher import Patch, load_patches
from mnnbuild.conform.run import (
    BUNDLE_CONFIG,
    ConformError,
    conform_model,
    engine_env,
    format_report,
    measure_patch_effect,
    write_report,
)
from mnnbuild.conform.workdir import claim_dir
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.partition import read_merge
from mnnbuild.model.spec import discover_specs
from mnnbuild.model.targets import known_archs
from mnnbuild.pipeline.cache import CacheTiers
from mnnbuild.pipeline.deferred import deferred_origin, materialize
from mnnbuild.pipeline.layout import bundle_model_dir, conform_dir, plugin_context_dir
from mnnbuild.pipeline.settings import Settings

PROJECT_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)


def split_target(target: str) -> tuple[str, str]:
    model, sep, arch = target.rpartition("-")
    if not sep or not model or arch not in known_archs():
        raise ConformError(f"target {target!r}: expected <model>-<arch> with arch one of {', '.join(known_archs())}")
    return model, arch


def patch_name(name: str, patches: list[Patch], option: str) -> str:
    """A patch named with or without its ``.patch`` suffix."""
    wanted = name if name.endswith(".patch") else f"{name}.patch"
    if wanted not in {p.name for p in patches}:
        raise ConformError(f"{option} {name!r}: no such patch; have {', '.join(p.name for p in patches)}")
    return wanted


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        lengths = []
    if not lengths or lengths[0] < 1:
        raise ConformError(f"--lengths {text!r}: expected prompt lengths in tokens, e.g. 2,9,16,127,128,129")
    return lengths


@dataclass(frozen=True)
class ConformPaths:
    """What a conform run reads of the DAG's outputs for one model and target."""

    bundle_model_dir: Path
    """The bundle's model dir, ``model/<name>/``, named as the bundle manifest says (after the source folder)."""
    original_dir: Path
    partition_dir: Path
    context_dir: Path
    twin_dir: Path
    conform_dir: Path
    """The default report dir."""


def locate(artifact_root: Path, model: str, arch: str) -> ConformPaths:
    """The DAG's outputs conform reads (the layout module's dirs, the bundle manifest's model dir name); a missing
    or unreadable bundle names the doit task that makes it."""
    from mnnbuild.stages.chain import stage_dir  # every stage module: only when locating

    task = f"doit bundle:{model}-{arch}"
    bundle_dir = stage_dir(artifact_root, "bundle", model, arch)
    if not (bundle_dir / BundleManifest.filename()).is_file():
        raise ConformError(f"{bundle_dir}: no finished bundle; run `{task}` first")
    try:
        manifest = BundleManifest.read(bundle_dir)
    except MnnbuildError as exc:
        raise ConformError(f"{exc}; run `{task}` again") from None
    fetch_deferred(artifact_root, model, arch)
    model_dir = bundle_model_dir(bundle_dir, manifest.model_name)
    if not (model_dir / BUNDLE_CONFIG).is_file():
        raise ConformError(f"{model_dir / BUNDLE_CONFIG}: missing from the finished bundle; run `{task}` again")
    return ConformPaths(
        bundle_model_dir=model_dir,
        original_dir=stage_dir(artifact_root, "fetch", model),
        partition_dir=stage_dir(artifact_root, "partition", model),
        context_dir=stage_dir(artifact_root, "context", model, arch),
        twin_dir=stage_dir(artifact_root, "twin", model, arch),
        conform_dir=conform_dir(artifact_root, model, arch),
    )


def fetch_deferred(artifact_root: Path, model: str, arch: str) -> None:
    """Fetch the files conform reads of stage dirs a cache hit restored without them (the bundle, the partition's
    graphs, the twins), each checked against its sha256, as a task that reads them does
    (`mnnbuild.pipeline.deferred.materialize`); a dir whose files the cache cannot give names the doit task that
    writes them. Without this, a warm cache left ``partition/qnn/llm.mnn`` out and the boundary comparison was
    skipped ("No such file") while conform passed."""
    from mnnbuild.stages.chain import CHAIN  # every stage module: only when locating

    partition_dir = CHAIN.stage_dir(artifact_root, "partition", model)
    read = [
        (CHAIN["bundle"], CHAIN.stage_dir(artifact_root, "bundle", model, arch), f"bundle:{model}-{arch}"),
        (CHAIN["partition"], partition_dir, f"partition:{model}"),
    ]
    try:
        merge = read_merge(partition_dir)
    except MnnbuildError:
        merge = {}  # said when conform reads it
    twin_dir = CHAIN.stage_dir(artifact_root, "twin", model, arch)
    read += [(CHAIN["twin"], plugin_context_dir(twin_dir, b), f"twin:{model}-{arch}") for b in merge]
    pending = [(stage, d, task) for stage, d, task in read if deferred_origin(d, stage.name) is not None]
    tiers = CacheTiers.from_env() if pending else None
    for stage, d, task in pending:
        try:
            got = materialize(stage, d, tiers)
        except Unavailable as exc:
            raise ConformError(f"{exc}; run `doit {task}`") from None
        if got is not None:
            log.info("conform: fetched the files of %s from the %s tier", d, got[0])


def run_conform(args: argparse.Namespace) -> int:
    model, arch = split_target(args.target)
    settings = Settings.from_env(PROJECT_ROOT)
    specs = discover_specs(list(settings.spec_dirs))
    if model not in specs:
        raise ConformError(
            f"target {args.target!r}: no model spec named {model!r} in {', '.join(map(str, settings.spec_dirs))}"
        )
    spec = specs[model]
    if arch not in spec.targets:
        raise ConformError(f"{spec.spec_path}: field 'targets' does not list {arch!r}")
    paths = locate(settings.artifact_root, model, arch)
    out_dir = claim_dir(Path(args.out).resolve() if args.out else paths.conform_dir)
    source = resolve_source(args.mnn_source)
    headers = resolve_qnn_headers(args.qnn_headers)
    all_patches = load_patches()
    skipped = {patch_name(name, all_patches, "--skip-patch") for name in args.skip_patch}
    effect_patch = patch_name(args.patch_effect, all_patches, "--patch-effect") if args.patch_effect else None
    if effect_patch in skipped:
        raise ConformError(f"--patch-effect {effect_patch!r}: the patch is skipped too; nothing to compare")
    lengths = parse_lengths(args.lengths) if args.lengths else None
    patches = [p for p in all_patches if p.name not in skipped]
    build = ensure_build(source, headers, jobs=args.jobs, patches=patches)
    driver = ensure_driver(build)
    report = conform_model(
        model=model,
        arch=arch,
        soc=spec.soc(arch),
        bundle_model_dir=paths.bundle_model_dir,
        original_dir=paths.original_dir,
        context_dir=paths.context_dir,
        twin_dir=paths.twin_dir,
        partition_dir=paths.partition_dir,
        out_dir=out_dir,
        build=build,
        driver=driver,
        max_new_tokens=args.max_new_tokens,
    )
    if not args.no_boundaries:
        report.boundaries = compare_boundaries(
            build, paths.original_dir, paths.partition_dir, out_dir / "compilefornpu", engine_env(build)
        )
    if effect_patch:
        without = ensure_build(source, headers, jobs=args.jobs, patches=[p for p in patches if p.name != effect_patch])
        report.patch_effect = measure_patch_effect(
            effect_patch,
            (build, driver),
            (without, ensure_driver(without)),
            out_dir,
            lengths or default_lengths(report.chunk),
            args.max_new_tokens,
        )
    write_report(report, out_dir)
    sys.stdout.write(format_report(report))
    sys.stdout.write(f"report: {out_dir / 'conform.json'}\n")
    return 0 if report.passed else 1


def _count(text: str) -> int:
    """A whole number of at least 1 (argparse reports anything else as one usage line, before the build starts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conform",
        help="run a bundle and its original model through MNN's own Llm engine (builds MNN once; see README)",
    )
    p.add_argument("target", help="<model>-<arch>, e.g. tiny-qwen3-v79 (its bundle must be built)")
    p.add_argument("--mnn-source", help="MNN source tree or tarball (default: $MNN_SOURCE)")
    p.add_argument(
        "--qnn-headers", help="QNN API headers dir holding QnnInterface.h (default: $QNN_SDK_ROOT/include/QNN)"
    )
    p.add_argument("--jobs", type=_count, default=2, help="parallel compile jobs of the MNN build (default 2)")
    p.add_argument("--max-new-tokens", type=_count, default=16, help="greedy tokens per prompt (default 16)")
    p.add_argument(
        "--skip-patch",
        action="append",
        default=[],
        metavar="NAME",
        help="build without this patch (its own build dir), e.g. to see what a fix changes; repeatable",
    )
    p.add_argument(
        "--patch-effect",
        metavar="NAME",
        help="also build MNN without this patch and record what it changes for the bundle at several prompt "
        "lengths (e.g. 0004-cpu-attention-padded-nc4hw4: which prompts an unpatched MNN gets wrong)",
    )
    p.add_argument(
        "--lengths", help="prompt lengths in tokens for --patch-effect (default: around the chunk, 1 to 2 chunks + 1)"
    )
    p.add_argument(
        "--no-boundaries",
        action="store_true",
        help="skip the comparison of our plugin boundaries with MNN's compilefornpu on the original model",
    )
    p.add_argument("--out", help="report dir (default: artifacts/<model>/<arch>/conform)")
    p.set_defaults(handler=run_conform)
