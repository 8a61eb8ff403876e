"""The artifact layout: every directory and file name the build writes or reads, in one place.

``artifacts/README.md`` describes the tree these names make (which stage writes which directory, and what each
holds); keep it in step when a name here changes. The runtime package keeps its own copy of the bundle-side
names, since it never imports the build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from mnnbuild.base.fsutil import MANIFEST_SUFFIX, ORIGIN_SUFFIX


# -- stage directories ---------------------------------------------------------------------------------
class Placed(Protocol):
    """What the layout needs of a stage declaration (`mnnbuild.pipeline.stage.Stage`): its directory's name and
    where its runs sit (``model``, ``part``, ``target`` or ``plugin``)."""

    name: str
    dir: str
    placement: str


def stage_dir(artifact_root: Path, stage: Placed, model: str, arch: str | None = None, part: str | None = None) -> Path:
    """Where ``stage`` writes for ``model`` (and ``arch``, for the per-target and per-plugin stages: the group dir of
    the latter); ``part`` (a VL model's ``visual``) puts a per-part stage under ``<model>/<part>/``; the language
    model's (``llm``) stay where a text LLM's are."""
    if part not in (None, "llm"):
        if stage.placement != "part":
            raise ValueError(f"stage {stage.name} is built once for all parts of a model, not per part")
        return Path(artifact_root) / model / part / stage.dir
    if stage.placement in ("model", "part"):
        return Path(artifact_root) / model / stage.dir
    if arch is None:
        raise ValueError(f"stage {stage.name} is built per target: an arch is needed")
    return Path(artifact_root) / model / arch / stage.dir


def plugin_name(binary: str) -> str:
    """The name of a plugin's dirs (and tasks): its binary's stem, ``qnn/graphllm0.bin`` -> ``graphllm0``. A
    ValueError unless that is a plain directory name (``qnn/...bin``'s stem is ``..``, ``qnn/..bin``'s ``.``)."""
    stem = Path(binary).stem
    if stem in ("", ".", ".."):
        raise ValueError(f"binary {binary!r} names no plugin dir: its stem {stem!r} is not a plain directory name")
    return stem


def plugin_context_dir(group_dir: Path, binary: str) -> Path:
    """One plugin's dir under a per-plugin stage's group dir (``<arch>/context``, ``<arch>/twin``):
    ``qnn/graphllm0.bin`` -> ``<group>/graphllm0``."""
    return Path(group_dir) / plugin_name(binary)


def plugin_dir(artifact_root: Path, stage: Placed, model: str, arch: str, binary: str) -> Path:
    """One plugin's dir of a per-plugin stage."""
    return plugin_context_dir(stage_dir(artifact_root, stage, model, arch), binary)


def manifest_file(stage: str) -> str:
    return f"{stage}{MANIFEST_SUFFIX}"


CODE_DIGESTS = "code-digests.json"
"""The code fingerprint's memo, beside a local cache (or in the artifact root when the cache is off or remote)."""


def origin_file(stage: str) -> str:
    """Where a task records whether its outputs were built or restored (kept out of the manifest)."""
    return f"{stage}{ORIGIN_SUFFIX}"


# -- io ------------------------------------------------------------------------------------------------
TESTDIR = "testdir"


def testdir(io_dir: Path, seq_len: int, last_row: bool = False) -> Path:
    """The reference inputs/outputs of one sample shape: ``testdir/<seq_len>``; a whole prefill block with the last
    row's logits only (``logits_index`` -1): ``testdir/<seq_len>-last``."""
    return Path(io_dir) / TESTDIR / (f"{seq_len}-last" if last_row else str(seq_len))


# -- partition -----------------------------------------------------------------------------------------
QNN_DIR = "qnn"
# the partitioned model with Plugin ops is qnn/<the model's graph file>: mnnbuild.model.modeldir.ModelPart.result_model
POSTREAT_FILE = "npu_postreat.json"
PARTITION_REPORT_JSON = "partition.json"
PARTITION_REPORT_TEXT = "partition.txt"
REFERENCE_INPUT = "input.mnn"
REFERENCE_OUTPUT = "output.mnn"
"""A sample's (io: ``testdir/<seq>/``) or one graph's (partition: ``qnn/<graph>/``) reference values."""
FOLDED_VALUES = "folded.mnn"
GRAPH_FILE = "graph.json"
"""One graph dir's description (partition: the MNN subgraph; modellib: the QNN graph)."""
LOWERING_SOURCE = "lowered_from.json"
"""partition: the fetched model and weight files every graph is lowered from, by hash (copied from the fetch
manifest): what the context and twin stages depend on of the fetch, so a tokenizer or config edit rebuilds no
binary."""
SPLIT_DIR = "split"
"""partition: ``split/<model file>``, the source model with its too-big convolutions split by output channels
(only when one was), which the graphs reading split ops index."""


LLM_GRAPHS = "graphllm"
"""Graph/binary name prefix of a language (or embedding) model's plugins, as upstream's export script names them."""
VISUAL_GRAPHS = "graphvisual"
"""The prefix of a visual encoder's plugins, so both parts of a VL model share one ``qnn/`` dir without clashing."""


def graph_name(shape_index: int, plugin: int, prefix: str = LLM_GRAPHS) -> str:
    """``graphllm<k>`` (decode, shape index 0) and ``graphllm<s>_<k>`` (later shapes), as upstream names them."""
    return f"{prefix}{plugin}" if shape_index == 0 else f"{prefix}{shape_index}_{plugin}"


def binary_path(plugin: int, prefix: str = LLM_GRAPHS) -> str:
    """The context binary of one plugin, relative to the model dir: ``qnn/graphllm<k>.bin``."""
    return f"{QNN_DIR}/{prefix}{plugin}.bin"


def twin_file(binary: str) -> str:
    """A plugin's unshared twin in its twin dir (``qnn/graphllm0.bin`` -> ``graphllm0.bin``): the same graphs without
    weight sharing, which the x86 HTP simulator can load; verify runs it, the bundle never ships it."""
    return Path(binary).name


# -- config / bundle / verify --------------------------------------------------------------------------
CONFIG_FILE = "config_qnn.json"
BUNDLE_MODEL_DIR = "model"
"""The bundle's device tree: ``model/<model name>/``."""


def bundle_model_dir(bundle_dir: Path, model_name: str) -> Path:
    """The model's device dir in a bundle: ``model/<model name>/``, named after the source folder or HF repo (the
    bundle manifest's ``model_name``), not the spec."""
    return Path(bundle_dir) / BUNDLE_MODEL_DIR / model_name


PROMPT_FILE = "prompt.txt"
PUSH_SCRIPT = "push.sh"
RUN_SCRIPT = "run.sh"
BUNDLE_README = "README.txt"
"""A VL bundle's note on where its visual encoder runs and which image sizes it was compiled for."""
VERIFY_REPORT_JSON = "verify.json"
VERIFY_REPORT_TEXT = "verify.txt"
REPORT_PAGE = "index.html"
CONFORM_DIR = "conform"


def conform_dir(artifact_root: Path, model: str, arch: str) -> Path:
    """``<model>/<arch>/conform/``: the report of ``python -m mnnbuild conform`` (a command, not a stage)."""
    return Path(artifact_root) / model / arch / CONFORM_DIR
