"""Speculative decoding: whether a model's bundle verifies drafts, at which length, and with which draft files.

MNN's engine speculates when its config sets ``speculative_type`` and the graph takes a shaped ``logits_index``
(``Llm::setSpeculativeConfig``); it then verifies ``draft_predict_length + 1`` tokens in one forward, and a QNN
plugin runs only the shapes it was compiled for, so every plugin needs one more graph at that length. The fetch
stage resolves what the spec asks (``speculative``, ``draft_predict_length``) against the model's ``config.json``
and records it (:class:`Speculation`); io adds the sample, config writes the fields, the bundle ships the files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.base.errors import MNNFormatError, ModelDirError
from mnnbuild.mnn.llm import (
    DEFAULT_LOOKUP_FILE,
    DRAFT_LENGTH_FIELD,
    EAGLE,
    EAGLE_FILE_FIELDS,
    EAGLE_GRAPH_IO,
    EAGLE_TREE_DEFAULTS,
    EAGLE_TREE_MAX,
    LOOKAHEAD,
    LOOKUP_FILE_FIELD,
    MODEL_CONFIG,
    SPECULATIVE_TYPE,
    SPECULATIVE_TYPES,
    eagle_tree_tokens,
    lookahead_settings,
    read_draft_map,
    read_lookup_file,
)
from mnnbuild.mnn.llm import draft_length as config_draft_length
from mnnbuild.model.modeldir import LLM_CONFIG, PLAIN_FILE_NAME, read_llm_config, read_model_config

SpeculativeKind = Literal["eagle", "lookahead"]
SpeculativeAsk = Literal["eagle", "lookahead", "off"]
HIDDEN_STATES = "hidden_states"
"""An Eagle target's second output: its tapped hidden states, the draft's input (``config.json`` ``hidden_states``)."""
EAGLE_DOWNLOADS = tuple(n for name in EAGLE_FILE_FIELDS.values() for n in (name, f"{name}.weight"))
"""The draft files an HF fetch also asks for (the engine's default names; absent ones are simply not there)."""


class Speculation(BaseModel):
    """What the fetch stage resolved: the kind, the draft length and the draft files it linked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SpeculativeKind
    draft_predict_length: int = Field(ge=1)
    files: tuple[str, ...] = ()
    """Model-dir files the speculation reads besides the target (Eagle's draft models; lookahead's lookup file)."""
    names: dict[str, str] = Field(default_factory=dict)
    """The config fields naming them (``eagle_model`` -> ``eagle.mnn``), written to ``config_qnn.json``."""
    decode_graph: bool = Field(default=True, exclude_if=lambda keep: keep)
    """False: no one-token graph; the engine pads a one-token forward to the verify length (``chunk_limits``)."""

    @property
    def verify_length(self) -> int:
        """Tokens of one verify forward: the sampled token and the drafts."""
        return self.draft_predict_length + 1

    def graph_lengths(self, lengths: tuple[int, ...], decode: int | None = None) -> tuple[int, ...]:
        """``lengths`` (decode and the prefill lengths, in graph order) with the verify length appended unless it is
        one of them already: each is one graph per plugin, and the prefill graphs keep their names. ``decode`` (the
        decode length) is dropped when the bundle is built without its graph."""
        if decode is not None and not self.decode_graph:
            lengths = tuple(n for n in lengths if n != decode)
        return lengths if self.verify_length in lengths else (*lengths, self.verify_length)

    @property
    def in_chunk_limits(self) -> bool:
        """lookahead verifies through ``Llm::forwardVec``, which pads a forward up to the smallest ``chunk_limits``
        entry holding it: the verify length must be one, or it would run the longest prefill graph. Eagle calls
        ``Llm::forwardRaw`` unpadded (``treeDecoding``), so its prefill blocks stay as without speculation, unless
        the bundle has no decode graph: a one-token forward (``Llm::forwardVec`` pads it too) then runs at the
        verify length."""
        return self.kind == LOOKAHEAD or not self.decode_graph


def _config_int(config: dict[str, Any], field: str, path: Path, default: int, most: int | None = None) -> int:
    value = config.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (most is not None and value > most):
        bound = f" at most {most}" if most is not None else ""
        raise ModelDirError(f"{path}: field {field!r} must be a positive integer{bound}, got {value!r}")
    return value


def _file_name(config: dict[str, Any], field: str, default: str, path: Path) -> str:
    name = config.get(field, default)
    if not isinstance(name, str) or not re.fullmatch(PLAIN_FILE_NAME, name):
        raise ModelDirError(
            f"{path}: field {field!r} must name a file in the model directory (letters, digits, '.', '_', '-'), "
            f"got {name!r}"
        )
    return name


def check_draft_file(model_dir: Path, field: str, name: str) -> None:
    """An Eagle draft file, as MNN's engine will read it (whatever its name ends in): a graph must parse, take the
    inputs and give the outputs the engine loads it with, and its weight file (when it has one) cover what it reads;
    ``eagle_d2t`` must hold one int32 tensor mapping every draft id to a target id of the model's embeddings. MNN
    crashed (SIGSEGV) on an empty or truncated d2t, and io blamed llm.mnn for it."""
    import numpy as np

    from mnnbuild.mnn import check_weight_ranges, embedding_info, load_model  # the schema: only here

    path = Path(model_dir) / name
    try:
        if field not in EAGLE_GRAPH_IO:
            offsets = read_draft_map(path)
            targets = offsets + np.arange(len(offsets))
            rows = embedding_info(model_dir).vocab
            if targets.min() < 0 or targets.max() >= rows:
                raise ModelDirError(
                    f"{path}: maps draft ids to target ids {int(targets.min())}..{int(targets.max())}, but the "
                    f"model's embeddings have {rows} rows; expected the d2t of this model's Eagle draft"
                )
            return
        graph = load_model(path)
        inputs, outputs = EAGLE_GRAPH_IO[field]
        missing = [n for n in inputs if n not in graph.input_names] + [
            n for n in outputs if n not in graph.tensor_names
        ]
        if missing:
            raise ModelDirError(
                f"{path}: config.json field {field!r} names a graph without {missing[0]!r}; MNN's engine loads it "
                f"with inputs {list(inputs)} and outputs {list(outputs)}"
            )
        if (Path(model_dir) / f"{name}.weight").is_file():
            check_weight_ranges(graph, Path(model_dir) / f"{name}.weight")
    except MNNFormatError as exc:
        raise ModelDirError(f"{exc} (config.json field {field!r})") from None


def model_lookahead_settings(model_dir: Path) -> tuple[dict[str, Any], Path]:
    """lookahead's settings of a model dir as MNN's engine runs them (``config.json`` merged with ``llm_config.json``,
    :func:`~mnnbuild.mnn.llm.lookahead_settings`) and the file that names ``lookup_file`` (``config.json`` when
    neither does); a bad value is one line naming the file and field."""
    config_path, llm_path = Path(model_dir) / MODEL_CONFIG, Path(model_dir) / LLM_CONFIG
    sources = [(config_path, read_model_config(model_dir)), (llm_path, read_llm_config(model_dir))]
    try:
        got = lookahead_settings(sources)
    except ValueError as exc:
        raise ModelDirError(str(exc)) from None
    return got, next((p for p, fields in reversed(sources) if LOOKUP_FILE_FIELD in fields), config_path)


def check_lookahead(model_dir: Path) -> str | None:
    """Check lookahead's settings and its lookup file (:func:`model_lookahead_settings`), which must name a file of
    the model dir that, when there, is a regular file of UTF-8 text of at most 1 MiB
    (:func:`~mnnbuild.mnn.llm.read_lookup_file`: MNN's engine waits on a FIFO for ever and reads the file whole).
    Returns the file's name when it is there (it ships with the bundle), else None."""
    got, where = model_lookahead_settings(model_dir)
    lookup = _file_name(got, LOOKUP_FILE_FIELD, DEFAULT_LOOKUP_FILE, where)
    try:
        text = read_lookup_file(Path(model_dir) / lookup)
    except MNNFormatError as exc:
        raise ModelDirError(f"{exc} ({where.name} field {LOOKUP_FILE_FIELD!r})") from None
    return None if text is None else lookup


def engine_files(model_dir: Path) -> tuple[str, ...]:
    """The draft files MNN's engine loads with the model as its ``config.json`` stands (an Eagle model's, those
    present): fetch links them whatever the spec asks, since io's tokenizer loads the model by that config, and
    PyPI MNN crashes (SIGSEGV) on an Eagle config whose ``eagle_d2t`` file is missing."""
    config = read_model_config(model_dir)
    if config.get(SPECULATIVE_TYPE) != EAGLE:
        return ()
    found: list[str] = []
    for field, default in EAGLE_FILE_FIELDS.items():
        name = config.get(field, default)
        if not isinstance(name, str) or not re.fullmatch(PLAIN_FILE_NAME, name):
            continue
        if (Path(model_dir) / name).is_file():  # the engine reads it even when the spec turns Eagle off
            check_draft_file(Path(model_dir), field, name)
        found += [n for n in (name, f"{name}.weight") if (Path(model_dir) / n).is_file()]
    return tuple(found)


def resolve(
    model_dir: Path,
    label: str,
    model: Any,
    model_file: str,
    asked: SpeculativeAsk | None,
    draft_length: int | None,
    decode_graph: bool = True,
) -> Speculation | None:
    """The speculation a bundle of ``model_dir`` is built for: the spec's ``speculative`` (None: the model's own
    ``speculative_type``), ``draft_predict_length`` (None: the model's, else the engine's 3) and ``decode_graph``;
    ``model`` is the parsed target graph. A model that cannot is one line naming the field that asked."""
    config_path = Path(model_dir) / MODEL_CONFIG
    config = read_model_config(model_dir)
    own = config.get(SPECULATIVE_TYPE) or None
    if asked == "off" or (asked is None and own is None):
        if not decode_graph:
            raise ModelDirError(
                f"{label}: spec field 'decode_graph' is false, but the bundle does not speculate ({config_path.name} "
                f"sets no {SPECULATIVE_TYPE!r} and the spec's 'speculative' is {asked or 'unset'}), so a one-token "
                "forward would have no graph; expected decode_graph = true, or speculative = 'eagle' or 'lookahead'"
            )
        return None
    if asked is None:
        if own not in SPECULATIVE_TYPES:
            raise ModelDirError(
                f"{config_path}: field {SPECULATIVE_TYPE!r} is {own!r}; bundles are built for "
                f"{' or '.join(repr(t) for t in SPECULATIVE_TYPES)} speculation: set spec field speculative = 'off' "
                "to build it without, or to one of those"
            )
        why = f"{config_path.name} field {SPECULATIVE_TYPE!r} is {own!r}"
    else:
        why = f"spec field 'speculative' is {asked!r}"
    kind: SpeculativeKind = EAGLE if (asked or own) == EAGLE else LOOKAHEAD
    if not decode_graph and kind != EAGLE:
        raise ModelDirError(
            f"{label}: spec field 'decode_graph' is false, but {why}: lookahead runs the target at one token when "
            "no n-gram matches, which would then be a padded forward (MNN's CPU attention gets those wrong without "
            "its patch 0004, docs/conformance.md); expected decode_graph = true, or speculative = 'eagle', whose "
            "loop never runs the target at one token"
        )
    dims = model.input_dims.get("logits_index")
    if not dims:
        raise ModelDirError(
            f"{label}: {why}, but {model_file} takes no shaped 'logits_index' input, so MNN's engine cannot verify "
            "drafts with it (Llm::canSpecDecode); expected a model exported with one, or spec field "
            "speculative = 'off'"
        )
    if draft_length is None:
        try:
            draft_length = config_draft_length(config, config_path)
        except ValueError as exc:
            raise ModelDirError(str(exc)) from None
        length_field = f"{config_path.name} field {DRAFT_LENGTH_FIELD!r}"
    else:
        length_field = f"spec field {DRAFT_LENGTH_FIELD!r}"
    files: list[str] = []
    names: dict[str, str] = {}
    if kind == EAGLE:
        if HIDDEN_STATES not in model.output_names:
            raise ModelDirError(
                f"{label}: {why}, but {model_file} has no output {HIDDEN_STATES!r} (outputs "
                f"{list(model.output_names)}), the Eagle draft's input; expected a target exported with "
                "llmexport --eagle_path"
            )
        for field, default in EAGLE_FILE_FIELDS.items():
            name = _file_name(config, field, default, config_path)
            if not (Path(model_dir) / name).is_file():
                raise ModelDirError(
                    f"{label}: required file {name} is missing: {why}, which needs the Eagle draft's files "
                    f"({config_path.name} field {field!r}, default {default!r}); expected the files llmexport "
                    "--eagle_path writes beside the model"
                )
            names[field] = name
            files.append(name)
            check_draft_file(Path(model_dir), field, name)
            if (Path(model_dir) / f"{name}.weight").is_file():
                files.append(f"{name}.weight")
        tree = {k: _config_int(config, k, config_path, v, EAGLE_TREE_MAX) for k, v in EAGLE_TREE_DEFAULTS.items()}
        depth, topk, most = tree["eagle_depth"], tree["eagle_topk"], eagle_tree_tokens(tree)
        if draft_length > most:
            raise ModelDirError(
                f"{label}: {length_field} is {draft_length}, but an Eagle tree of eagle_depth {depth} and "
                f"eagle_topk {topk} ({config_path.name}) holds only {most} draft tokens, so the engine would verify "
                f"{most + 1}, not {draft_length + 1}; expected {DRAFT_LENGTH_FIELD} <= {most}"
            )
    else:
        lookup = check_lookahead(Path(model_dir))
        if lookup is not None:  # read when present (lookahead.cpp): it ships with the bundle
            files.append(lookup)
            names[LOOKUP_FILE_FIELD] = lookup
    return Speculation(
        kind=kind, draft_predict_length=draft_length, files=tuple(files), names=names, decode_graph=decode_graph
    )
