"""fetch: make a model's files available under ``artifacts/<model>/model/`` without copying them.

A ``local`` source is linked in place. An ``hf`` source is downloaded through
huggingface-hub into its cache (only the files the chain needs), pinned by a lock file
next to the spec, and linked from there.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mnnbuild.base.errors import ModelDirError, field_problems
from mnnbuild.base.fsutil import atomic_write_text, relative_symlink, staged_dir
from mnnbuild.manifests.fetch import FetchInputs, FetchManifest, FetchParams, HfLock, SourceRecord, lock_pinned
from mnnbuild.model.modeldir import ALL_FILES, VISUAL_FILES, ModelPart, family_files, validate_model_dir
from mnnbuild.model.spec import HfSource, ModelSpec
from mnnbuild.model.speculation import EAGLE_DOWNLOADS, Speculation, engine_files, resolve
from mnnbuild.pipeline.manifest import FileRecord, tool_versions
from mnnbuild.pipeline.stage import At, Stage

log = logging.getLogger(__name__)


def read_lock(path: Path, source: HfSource) -> HfLock | None:
    """The lock for ``source`` if the lock file pins that repo and revision."""
    if not path.is_file():
        return None
    try:
        lock = HfLock.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # not UTF-8 (ValueError), not JSON or a wrong field (ValidationError)
        raise ModelDirError(f"{path}: invalid lock file: {field_problems(exc)}; delete it to re-resolve") from None
    if lock.repo != source.hf or lock.revision != source.revision:
        log.info(
            "%s pins %s@%s; spec asks for %s@%s, re-resolving",
            path,
            lock.repo,
            lock.revision,
            source.hf,
            source.revision,
        )
        return None
    return lock


def network_cause(exc: BaseException) -> str:
    """The innermost error behind ``exc`` (a DNS or connection failure under huggingface-hub's wrapper), one line."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def download_hf(source: HfSource, lock_path: Path, files: tuple[str, ...], *, update: bool = False) -> tuple[Path, str]:
    """Download (or find in the HF cache) the chain's files; returns the snapshot dir and commit.

    The commit pinned in ``lock_path`` is used when there is one; ``update`` resolves the spec's
    revision again and pins what it resolves to now.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    lock = None if update else read_lock(lock_path, source)
    revision = lock.commit if lock else source.revision
    try:
        snapshot = Path(snapshot_download(source.hf, revision=revision, allow_patterns=list(files)))
    except LocalEntryNotFoundError as exc:
        where = f"HF repo {source.hf}@{revision}: not in the local Hugging Face cache"
        if constants.is_offline_mode():
            raise ModelDirError(
                f"{where} and downloads are off (HF_HUB_OFFLINE is set); unset it, or run once where "
                f"{constants.ENDPOINT} is reachable"
            ) from None
        raise ModelDirError(
            f"{where}, and {constants.ENDPOINT} could not be reached ({network_cause(exc)}); check the network "
            "(DNS, proxy, HF_ENDPOINT) and run again"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelDirError(f"HF repo {source.hf}@{revision}: download failed: {exc}") from None
    commit = snapshot.name
    if lock is None:
        atomic_write_text(
            lock_path, HfLock(repo=source.hf, revision=source.revision, commit=commit).model_dump_json(indent=2) + "\n"
        )
        log.info("pinned %s@%s to %s in %s", source.hf, source.revision, commit, lock_path)
    return snapshot, commit


def fetch(inputs: FetchInputs, params: FetchParams, out_dir: Path) -> FetchManifest:
    """Link the model's files into ``out_dir`` and record each one by size and sha256."""
    if isinstance(inputs.source, HfSource):
        if inputs.lock_path is None:
            raise ValueError("an hf source needs lock_path")
        # an Eagle model's draft files by the engine's default names (a model without them has none to download):
        wanted = (*params.files, *EAGLE_DOWNLOADS)  # io's tokenizer loads them even when the spec turns Eagle off
        src_dir, commit = download_hf(inputs.source, inputs.lock_path, wanted)
        where = f"HF repo {inputs.source.hf}@{commit} (cached at {src_dir})"
        record = SourceRecord(kind="hf", location=inputs.source.hf, revision=inputs.source.revision, commit=commit)
    else:
        if inputs.source_dir is None:
            raise ValueError("a local source needs source_dir")
        src_dir = inputs.source_dir
        where = f"model directory {src_dir} (source of {inputs.model})"
        record = SourceRecord(kind="local", location=inputs.source.local)

    # the files are hashed while the graph is parsed and checked (hashlib lets go of the GIL): the weights' hash, most
    # of a fetch, and the parse overlap
    base = Path(src_dir).absolute()  # records name the files relative to it
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = {n: pool.submit(FileRecord.of, base / n, base) for n in params.files if (base / n).is_file()}
        try:
            part, present = validate_model_dir(src_dir, where, params.family, params.visual_encoder)
            speculation = speculation_of(src_dir, where, part, params)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
        # the part's files whatever config.json calls them (an HF download asked only for params.files)
        names = [n for n in present if n in params.files or n in (part.model_file, part.weight_file)]
        extra = (*(speculation.files if speculation else ()), *engine_files(src_dir))
        names += [n for n in dict.fromkeys(extra) if n not in names]
        records = [hashing[n].result() if n in hashing else FileRecord.of(base / n, base) for n in names]
    with staged_dir(out_dir) as tmp:
        for name in names:
            # Link to the real file (HF snapshot entries are symlinks themselves): weights are never copied.
            # A relative link keeps working when the checkout and its artifacts move together.
            relative_symlink(src_dir / name, tmp / name)
        manifest = FetchManifest(
            model=inputs.model,
            inputs=records,
            params=params,
            tools=tool_versions(),
            outputs=records,
            source=record,
            part=part,
            speculation=speculation,
        )
        manifest.write(tmp)
    log.debug(
        "fetch %s: %d files from %s (%s graph %s)", inputs.model, len(records), where, part.family, part.model_file
    )
    return manifest


def speculation_of(model_dir: Path, where: str, part: ModelPart, params: FetchParams) -> Speculation | None:
    """What speculation the bundle is built for (`mnnbuild.model.speculation.resolve`); an embedding model none."""
    if part.family != "llm":
        return None
    from mnnbuild.mnn import load_model  # the schema: validate_model_dir parsed it already, so it reads cleanly

    model = load_model(Path(model_dir) / part.model_file)
    return resolve(
        model_dir, where, model, part.model_file, params.speculative, params.draft_predict_length, params.decode_graph
    )


def update_lock(source: HfSource, lock_path: Path, files: tuple[str, ...] = ALL_FILES) -> HfLock:
    """Resolve the spec's revision again (``doit update:<model>``) and pin the result; the next fetch uses it."""
    old = read_lock(lock_path, source)
    _, commit = download_hf(source, lock_path, files, update=True)
    new = HfLock(repo=source.hf, revision=source.revision, commit=commit)
    if old != new:
        log.info("%s@%s: %s -> %s", source.hf, source.revision, old.commit if old else "(not pinned)", commit)
    return new


def fetch_params(spec: ModelSpec, at: At | None = None) -> FetchParams:
    """The spec's family and the files its chain takes from the model dir (the only ones an HF fetch downloads;
    a VL model's encoder files too, checked against the spec's ``visual_encoder``)."""
    asked = {
        "speculative": spec.speculative,
        "draft_predict_length": spec.draft_predict_length,
        "decode_graph": spec.decode_graph,
    }
    if spec.family == "vl":
        files = (*family_files("llm"), *VISUAL_FILES)
        return FetchParams(family="llm", files=files, visual_encoder=spec.visual_encoder, **asked)
    family = "embedding" if spec.family == "embedding" else "llm"
    return FetchParams(family=family, files=family_files(family), **asked)


def fetch_fields(spec: ModelSpec, at: At) -> dict[str, object]:
    """Where the model comes from: an HF repo pinned by its lock file, or a local directory."""
    if isinstance(spec.source, HfSource):
        return {"source": spec.source, "lock_path": spec.lock_path}
    return {"source": spec.source, "source_dir": spec.local_dir()}


def describe(spec: ModelSpec, at: At) -> str:
    if isinstance(spec.source, HfSource):
        return f"link the {spec.name} model files from HF {spec.source.hf}@{spec.source.revision}"
    return f"link the {spec.name} model files from {spec.local_dir()}"


STAGE = Stage(
    entry=fetch,
    params_of=fetch_params,
    describe=describe,
    fields_of=fetch_fields,
    outputs=ALL_FILES,
    dir="model",
    # its outputs are links into this machine's source or HF cache: restoring another checkout's links
    # would point there, and relinking is as cheap as a restore
    cacheable=False,
    reads_source=True,
    pinned=lock_pinned,
    update=update_lock,
    symlinks=True,
    doc="Link a local model dir, or download a Hugging Face repo's files (pinned in `models/<name>.lock.json`).",
)
