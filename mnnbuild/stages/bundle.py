"""bundle: the directory a phone needs, as upstream's adb push commands lay it out.

``<out>/model/<ModelName>/`` holds ``config_qnn.json``, the tokenizer, ``embeddings_bf16.bin`` (an untied model's),
``prompt.txt``, and from the partition the partitioned graph (``qnn/llm.mnn``, ``qnn/embedding.mnn``), the weight file
its CPU ops and the tied embeddings read (``llm.mnn.weight``, ``embedding.mnn.weight``: only those bytes of the
model's) and ``llm_config.json`` pointing at them; then ``qnn/graph*.bin``. ``push.sh`` and ``run.sh`` push it with
the QNN runtime libraries that match the target's HTP arch and start ``llm_demo`` on the device. Every file is a copy
(a reflink where the file system shares blocks), never a link: the bundle is the user's to ship and edit, and an edit
must not reach the source model, the HF cache or an earlier stage. The scripts quote every value for the local shell
and again for the device shell that ``adb shell`` hands its command line to.
"""

from __future__ import annotations

import logging
import re
import shlex
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mnnbuild.base.errors import StageError
from mnnbuild.base.fsutil import atomic_write_text, confined, copy_content, staged_dir
from mnnbuild.base.sizes import human_bytes
from mnnbuild.manifests.bundle import BundleInputs, BundleManifest, BundleParams
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest, read_merge
from mnnbuild.model.modeldir import OPTIONAL_FILES, VISUAL_PART, ModelPart, prompt_file_text, tokenizer_file
from mnnbuild.model.spec import DEVICE_NAME_PATTERN, HfSource, ModelSpec
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.layout import (
    BUNDLE_MODEL_DIR,
    BUNDLE_README,
    CONFIG_FILE,
    PROMPT_FILE,
    PUSH_SCRIPT,
    QNN_DIR,
    RUN_SCRIPT,
    plugin_context_dir,
)
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Ending, Stage

log = logging.getLogger(__name__)


def place(src: Path, dst: Path) -> None:
    """Put a copy of ``src``'s content at ``dst`` (`copy_content`: a reflink where the file system shares blocks)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_content(src.resolve(), dst)


def _script(lines: list[str]) -> str:
    return "#!/usr/bin/env bash\n" + "\n".join(lines) + "\n"


def qnn_release(build: str) -> str | None:
    """``major.minor.patch`` of a QNN build id (``v2.51.0.260929181845`` -> ``2.51.0``), None when it has none."""
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)(?:\.|$)", build)
    return ".".join(found.groups()) if found else None


def sdk_check(soc: Soc, qnn_build: str) -> list[str]:
    """push.sh's first lines: the SDK under QNN_SDK_ROOT is checked before anything is pushed. Its ``sdk.yaml``
    version may not be older than the QNN that built the context binaries (an older device runtime cannot load
    them), and it must hold the libraries the target's arch needs. Each problem is one line on stderr, exit 2."""
    arch = soc.arch_number
    need = qnn_release(qnn_build)
    fail = ['sdk_fail() { printf "push.sh: %s\\n" "$1" >&2; exit 2; }']
    libs = [
        f"for lib in {' '.join(device_libraries(arch))}; do",
        '  [ -f "$QNN_SDK_ROOT/lib/$lib" ] || sdk_fail "QNN_SDK_ROOT=$QNN_SDK_ROOT has no lib/$lib, which a '
        f'{soc.name} (HTP v{arch}) phone needs: use a QAIRT SDK that ships the v{arch} Stub/Skel libraries"',
        "done",
    ]
    if need is None:  # a build id without a release number: nothing to compare against
        return [*fail, "# the context binaries' QNN build names no release: the SDK version is not checked", *libs]
    version = [
        f"need={need}  # the QNN release that built the context binaries (bundle manifest: qnn_build v{need}…)",
        'line="$(grep -m 1 "^version:" "$QNN_SDK_ROOT/sdk.yaml" 2>/dev/null || true)"',
        """re='^version:[[:space:]]*"?v?([0-9]+)[.]([0-9]+)[.]([0-9]+)'""",
        '[[ "$line" =~ $re ]] || sdk_fail "QNN_SDK_ROOT=$QNN_SDK_ROOT: no QAIRT version in $QNN_SDK_ROOT/sdk.yaml '
        '(a line version: X.Y.Z); these context binaries need QAIRT $need or newer"',
        "h1=${BASH_REMATCH[1]} h2=${BASH_REMATCH[2]} h3=${BASH_REMATCH[3]} have=$h1.$h2.$h3",
        'read -r n1 n2 n3 <<< "${need//./ }"',
        "if (( 10#$h1 < 10#$n1 || (10#$h1 == 10#$n1 && (10#$h2 < 10#$n2 || (10#$h2 == 10#$n2 && 10#$h3 < 10#$n3))) ))"
        "; then",
        '  sdk_fail "QNN_SDK_ROOT=$QNN_SDK_ROOT is QAIRT $have, older than the QNN $need that built these context '
        'binaries (the phone would refuse to load them): use QAIRT $need or newer"',
        "fi",
    ]
    return fail + version + libs


def device_libraries(arch: int) -> tuple[str, ...]:
    """The QNN runtime libraries a phone needs for HTP ``v<arch>``, relative to the SDK's ``lib/``."""
    return (
        "aarch64-android/libQnnHtp.so",
        f"aarch64-android/libQnnHtpV{arch}Stub.so",
        f"hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so",
        "aarch64-android/libQnnSystem.so",
    )


def device_scripts(model_name: str, soc: Soc, tokenizer: str, qnn_build: str) -> dict[str, str]:
    """push.sh and run.sh for an Android device with adb, following the upstream steps; push.sh checks the SDK
    against ``qnn_build`` (the QNN build that made the context binaries) before it pushes anything."""
    arch = soc.arch_number
    header = [
        "# Generated by mnnbuild. Needs adb, QNN_SDK_ROOT (a QAIRT SDK not older than the one that built",
        "# the context binaries: checked first) and MNN_BUILD_DIR (an Android build of llm_demo with -DMNN_QNN=ON).",
        f"# Target: {soc.name} (soc id {soc.soc_id}, HTP v{arch}); the Stub/Skel libraries must match it.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        "# q VALUE: VALUE single-quoted for the device's shell, which runs the command line adb shell sends",
        "q() { printf \"'%s'\" \"$(printf '%s' \"$1\" | sed \"s/'/'\\\\\\\\''/g\")\"; }",
        'PHONE_DIR="${PHONE_DIR:-/data/local/tmp/mnn-llm-qnn}"',
        f"MODEL_NAME={shlex.quote(model_name)}",
        'PHONE_MODEL_DIR="$PHONE_DIR/model/$MODEL_NAME"',
    ]
    push = header + [
        ': "${QNN_SDK_ROOT:?set QNN_SDK_ROOT to a QAIRT SDK}"',
        ': "${MNN_BUILD_DIR:?set MNN_BUILD_DIR to the Android build directory holding llm_demo}"',
        *sdk_check(soc, qnn_build),
        'adb shell "rm -rf $(q "$PHONE_DIR") && mkdir -p $(q "$PHONE_MODEL_DIR")"',
        'adb push "$MNN_BUILD_DIR/llm_demo" "$PHONE_DIR/"',
        'adb push "$MNN_BUILD_DIR/libMNN.so" "$PHONE_DIR/"',
        *(f'adb push "$QNN_SDK_ROOT/lib/{lib}" "$PHONE_DIR/"' for lib in device_libraries(arch)),
        'for f in "$here/model/$MODEL_NAME"/*; do adb push "$f" "$PHONE_MODEL_DIR/"; done',
        f'adb push "$here/model/$MODEL_NAME/{PROMPT_FILE}" "$PHONE_DIR/"',
        'adb shell "chmod +x $(q "$PHONE_DIR/llm_demo")"',
    ]
    run = header + [
        'adb shell "cd $(q "$PHONE_DIR") && export LD_LIBRARY_PATH=$(q "$PHONE_DIR") && '
        'export ADSP_LIBRARY_PATH=$(q "$PHONE_DIR") && '
        f'./llm_demo $(q "$PHONE_MODEL_DIR/{CONFIG_FILE}") $(q "$PHONE_DIR/{PROMPT_FILE}")"',
    ]
    return {PUSH_SCRIPT: _script(push), RUN_SCRIPT: _script(run)}


def visual_readme(model_name: str, image_sizes: tuple[str, ...], encoder: str) -> str:
    """What a VL bundle's README says about its encoder: where it runs and which image sizes it was built for."""
    return (
        f"{model_name}: a vision-language model. The language model runs on the NPU (qnn/graphllm*.bin), and so\n"
        f"does the visual encoder ({encoder}, weights in {encoder}.weight; qnn/graphvisual*.bin), compiled for\n"
        f"the image sizes {', '.join(image_sizes)} (width x height), one graph each. MNN resizes every image\n"
        "itself (image_min_pixels / image_max_pixels in llm_config.json): a compiled size is used only when that\n"
        "resize lands on it exactly (the QNN plugin picks its graph by input shape).\n"
    )


def _partition_files(inputs: BundleInputs, partition_dir: Path, part: ModelPart, dest: Path) -> list[tuple[Path, Path]]:
    """What the bundle takes of one partition, as (source, destination): the partitioned model, its weight file and
    (the model's own graph) ``llm_config.json``, each where the partition manifest says."""
    manifest = inputs.manifest(PartitionManifest, partition_dir)
    where = partition_dir / PartitionManifest.filename()
    weights = manifest.weights
    names = [part.result_model, weights.file, *([weights.llm_config] if weights.llm_config else [])]
    copies = []
    for name in names:
        src = confined(partition_dir, name, f"{where}: field 'weights'")
        if not src.is_file():
            raise StageError(f"{src}: file missing; {where} lists it: run the partition again")
        copies.append((src, dest / name))
    return copies


def assemble_bundle(inputs: BundleInputs, params: BundleParams, out_dir: Path) -> BundleManifest:
    """Lay out the device directory and the scripts that push and run it."""
    model_dir = Path(inputs.model_dir)
    # the name reaches push.sh/run.sh and the device's shell: quoted there, and refused here unless plain
    if not re.fullmatch(DEVICE_NAME_PATTERN, inputs.model_name):
        raise StageError(
            f"{inputs.model}: model directory name {inputs.model_name!r} may only hold letters, digits, '.', '_' "
            "and '-' (and start with a letter or digit)"
        )
    tokenizer = tokenizer_file(model_dir)
    fetched = inputs.manifest(FetchManifest, model_dir)
    part = fetched.part
    # each binary sits in its plugin's context dir, <plugin>/qnn/: its manifest says which QNN built it, for which SoC
    partitions = [inputs.partition_dir, *([inputs.visual_partition_dir] if inputs.visual_partition_dir else [])]
    plugin_dirs = {b: plugin_context_dir(inputs.context_dir, b) for d in partitions for b in read_merge(Path(d))}
    binaries = [plugin_dir / b for b, plugin_dir in plugin_dirs.items()]
    contexts = [inputs.manifest(ContextManifest, plugin_dir) for plugin_dir in plugin_dirs.values()]
    builds = sorted({c.tools.get("QNN", "unknown") for c in contexts})
    if len(builds) != 1:
        raise StageError(f"{inputs.model}: context binaries were built by different QNN builds {builds}")
    wrong = [c.binary for c in contexts if c.params.soc != params.soc]
    if wrong:
        raise StageError(f"{inputs.model}: {wrong[0]} was built for another SoC than {params.soc.name}")
    with staged_dir(out_dir) as tmp:
        dest = tmp / BUNDLE_MODEL_DIR / inputs.model_name
        copies = [(Path(inputs.config_dir) / CONFIG_FILE, dest / CONFIG_FILE)]
        for name in (tokenizer, *OPTIONAL_FILES):
            if (model_dir / name).exists():
                copies.append((model_dir / name, dest / name))
        for name in fetched.speculation.files if fetched.speculation else ():  # the draft model, on the CPU
            where = f"{model_dir / FetchManifest.filename()}: field 'speculation.files'"
            src = confined(model_dir, name, where, follow_last=False)
            if not src.is_file():
                raise StageError(f"{src}: file missing; the fetch manifest lists it: run the fetch again")
            copies.append((src, dest / name))
        copies += _partition_files(inputs, Path(inputs.partition_dir), part, dest)
        if params.image_sizes:
            encoder = VISUAL_PART
            if inputs.visual_partition_dir is None:
                raise StageError(f"{inputs.model}: a VL bundle needs the encoder's partition")
            # MNN loads visual_model with the weights beside it (<model>.weight)
            copies += _partition_files(inputs, Path(inputs.visual_partition_dir), encoder, dest)
            readme = visual_readme(inputs.model_name, params.image_sizes, encoder.result_model)
            atomic_write_text(tmp / BUNDLE_README, readme)
        copies += [(binary, dest / QNN_DIR / binary.name) for binary in binaries]
        # two copies at a time: a bundle is GBs of weights and context binaries, and copying lets go of the GIL
        # (measured: docs/benchmarks.md, "Numbers behind the code")
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda pair: place(*pair), copies))
        atomic_write_text(dest / PROMPT_FILE, params.prompt)
        for name, text in device_scripts(inputs.model_name, params.soc, tokenizer, builds[0]).items():
            atomic_write_text(tmp / name, text)
            (tmp / name).chmod((tmp / name).stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        outputs = record_outputs(tmp)
        manifest = BundleManifest(
            model=inputs.model,
            target=params.soc.dsp_arch,
            inputs=[r for r in outputs if r.path.startswith("model/")],
            params=params,
            tools=tool_versions(qnn=builds[0]),
            outputs=outputs,
            model_name=inputs.model_name,
            qnn_build=builds[0],
        )
        manifest.write(tmp)
    total = sum(r.size for r in outputs)
    log.debug("bundle %s-%s: %d files, %s", inputs.model, params.soc.dsp_arch, len(outputs), human_bytes(total))
    return manifest


def bundle_params(spec: ModelSpec, at: At) -> BundleParams:
    soc = spec.soc(str(at.arch))
    return BundleParams(soc=soc, prompt=prompt_file_text(spec.verify.prompt), image_sizes=tuple(spec.image_sizes))


def device_name(spec: ModelSpec) -> str:
    """The model's directory name on the device: the HF repo's name, or the local directory's."""
    if isinstance(spec.source, HfSource):
        return spec.source.hf.rpartition("/")[2]
    return spec.local_dir().name


def bundle_fields(spec: ModelSpec, at: At) -> dict[str, object]:
    return {"model_name": device_name(spec)}


def describe(spec: ModelSpec, at: At) -> str:
    return f"device bundle of {spec.name} for {spec.soc(str(at.arch)).name} (HTP {at.arch})"


STAGE = Stage(
    entry=assemble_bundle,
    params_of=bundle_params,
    describe=describe,
    fields_of=bundle_fields,
    placement="target",
    outputs=(f"{BUNDLE_MODEL_DIR}/<name>/", PUSH_SCRIPT, RUN_SCRIPT),
    tools=frozenset({"QNN"}),
    # cached although a rebuild copies what a restore would: a warm verify or report then needs only its manifest
    # (the binaries' blobs are the context stage's; the entry adds the shipped weight file); restored as copies
    defer=("*",),
    links=False,
    ending=Ending(product=True),
    doc=(
        "Device bundle per target: the device directory, `push.sh`/`run.sh` and a manifest (created once the "
        "model's partition ran)."
    ),
)
