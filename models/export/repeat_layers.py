#!/usr/bin/env python3
"""Make a deeper MNN LLM from an exported one by repeating its decoder layers (issue 44, maintenance only).

An 8B model in torch's fp32 does not fit a 24 GB box, so the real-dims benchmark model is made from a few layers
llmexport did export: layer 0 stays where it is (its ops also compute what every layer shares: the rotary phase, the
constants the converter merged), layers ``1 .. K-1`` too, and each further layer ``i`` is a copy of exported layer
``1 + (i - 1) % (K - 1)``: its ops (tensor and op names renamed to layer ``i``, the Attention op's ``layerIndex`` set
to ``i``) reading the residual stream of layer ``i - 1`` and the shared tensors of layer 0, its weights a copy of
that layer's bytes in ``llm.mnn.weight`` at offsets of its own. The final norm and the lm_head follow the last layer
in the graph and in the weight file (their offsets, and ``tie_embeddings`` in ``llm_config.json``, moved by the
bytes inserted). Every byte of every layer is a byte llmexport wrote; no weight is made up. Only ``mnnbuild.mnn``
reads and writes the files (never ``MNN.tools``).

    python models/export/repeat_layers.py SRC --layers N --out DEST

``DEST`` gets the model files of ``SRC`` and ``repeated_layers.json`` (`NOTE_FILE`), which says how the model was
made: the exported layer count, which exported layer each layer copies, the source files' sha256. ``DEST`` is
written as a whole (staged beside it, then renamed into place; an existing ``DEST`` is replaced).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import re
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPT_DIR.parent.parent
if str(REPO_ROOT) not in sys.path:  # mnnbuild from this checkout when run as a script
    sys.path.insert(0, str(REPO_ROOT))

from publish import PublishError, check_replaceable, staged_model_dir  # noqa: E402  (this script's dir)

from mnnbuild.base.errors import MNNFormatError  # noqa: E402
from mnnbuild.mnn import (  # noqa: E402
    KeptBlock,
    MnnModel,
    Op,
    WeightPlan,
    external_tables,
    load_model,
    save_model,
    tie_embeddings,
    write_weights,
)

LOG = logging.getLogger("repeat_layers")

NOTE_FILE = "repeated_layers.json"
"""What a repeated model's dir says about how it was made (read by ``benchmarks/bench_scale.py``)."""
MODEL_FILE = "llm.mnn"
WEIGHT_FILE = "llm.mnn.weight"
LLM_CONFIG = "llm_config.json"
CONFIG = "config.json"
COPIED_FILES = (CONFIG, "tokenizer.mtok", "tokenizer.txt", "embeddings_bf16.bin", "README.md")
"""Files of the source dir taken over unchanged (those present)."""
REFUSED_FILES = ("visual.mnn", "embedding.mnn", "eagle.mnn", "audio.mnn")
"""Parts whose meaning depends on the layers (an encoder's deepstack taps, an Eagle draft's taps): not repeated."""
LAYER_COUNT_FIELDS = ("layer_nums", "num_hidden_layers")
"""``llm_config.json`` fields holding the layer count (MNN's engine sizes its per-layer KV state from it)."""
FLAT_LISTS = frozenset({"tie_embeddings", "key_value_shape", "mrope_section"})
"""``llm_config.json`` list fields known not to hold one entry per layer; another list as long as the layer count
may (a per-layer attention type, say) and is refused rather than left stale."""
ATTENTION = "Attention"
MAX_LAYERS = 1024
"""The most layers asked for: several times any released decoder's (Qwen3-235B has 94); 10^8 used to run for
minutes building a graph no file could hold."""
LAYER_NAME = re.compile(r"(?:^|/)(?:blocks|layers)\.(\d+)/")
"""llmexport's per-layer op and tensor names: ``/blocks.3/...`` and ``/layers.3/...``."""


class RepeatError(ValueError):
    """A model whose layers cannot be repeated (one line naming the file and what is wrong)."""


@dataclass(frozen=True)
class Layer:
    """One exported decoder layer: its ops (a run of the op list), the residual stream it writes, its weight bytes."""

    index: int
    first_op: int
    last_op: int  # inclusive: the op writing `output`
    output: int
    weights: tuple[int, int]  # [start, end) in the weight file

    @property
    def ops(self) -> range:
        return range(self.first_op, self.last_op + 1)

    @property
    def weight_bytes(self) -> int:
        return self.weights[1] - self.weights[0]


def op_layer(op: Op) -> int | None:
    found = {int(m) for m in LAYER_NAME.findall(op.name)}
    if len(found) > 1:
        raise RepeatError(f"op {op.name!r} names layers {sorted(found)}")
    return found.pop() if found else None


def _op_ranges(op: Op) -> list[tuple[int, int]]:
    if op.main is None or op.external_path:
        return []
    return [
        (int(t.external[0]), int(t.external[0]) + sum(int(v) for v in t.external[1:])) for t in external_tables(op.main)
    ]


def find_layers(model: MnnModel, where: str) -> tuple[list[Layer], tuple[int, int]]:
    """The model's decoder layers in op order, and the weight bytes ``[start, end)`` the ops after the last layer
    read (final norm, lm_head). RepeatError (naming ``where``) when the graph is not laid out as llmexport lays out a
    plain decoder: a run of ops per layer, one Attention op each, only the residual stream leaving a layer >= 1."""
    if any(op.type == "LinearAttention" for op in model.ops) or model.subgraphs:
        raise RepeatError(f"{where}: linear-attention layers or subgraphs: only a plain decoder is repeated")
    attention = [i for i, op in enumerate(model.ops) if op.type == ATTENTION]
    if len(attention) < 2:
        raise RepeatError(f"{where}: {len(attention)} Attention ops; repeating needs 2 or more exported layers")
    last: dict[int, int] = {}
    for i, op in enumerate(model.ops):
        layer = op_layer(op)
        if layer is not None:
            last[layer] = i
    count = len(attention)
    if sorted(last) != list(range(count)):
        raise RepeatError(
            f"{where}: op names mention layers {sorted(last)}, expected 0..{count - 1} (one per Attention)"
        )
    ends = [last[s] for s in range(count)]
    if ends != sorted(ends):
        raise RepeatError(f"{where}: the layers' ops are not in layer order")
    layers: list[Layer] = []
    start = 0
    for s, end in enumerate(ends):
        att = [i for i in attention if start <= i <= end]
        if len(att) != 1 or model.ops[att[0]].main is None or int(model.ops[att[0]].main.layerIndex) != s:
            raise RepeatError(
                f"{where}: ops {start}..{end} of layer {s} hold Attention ops {att}, expected one of layer {s}"
            )
        if len(model.ops[end].outputs) != 1:
            raise RepeatError(f"{where}: layer {s}'s last op {model.ops[end].name!r} has not exactly one output")
        others = [model.ops[i].name for i in range(start, end + 1) if op_layer(model.ops[i]) not in (None, s)]
        if others:
            raise RepeatError(f"{where}: layer {s}'s ops include ops of other layers: {others[:3]}")
        spans = [r for i in range(start, end + 1) for r in _op_ranges(model.ops[i])]
        if not spans:
            raise RepeatError(f"{where}: layer {s} reads no weights")
        weights = (min(a for a, _ in spans), max(b for _, b in spans))
        layers.append(Layer(s, start, end, model.ops[end].outputs[0], weights))
        start = end + 1
    tail = [r for i in range(start, len(model.ops)) for r in _op_ranges(model.ops[i])]
    tail_weights = (min(a for a, _ in tail), max(b for _, b in tail)) if tail else (layers[-1].weights[1],) * 2
    bounds = [*(x.weights for x in layers), tail_weights]
    for (_, end_a), (start_b, _) in zip(bounds, bounds[1:], strict=False):
        if start_b < end_a:
            raise RepeatError(f"{where}: the layers' weight bytes overlap or are not in layer order ({bounds})")
    _check_leaks(model, layers, where)
    return layers, tail_weights


def _check_leaks(model: MnnModel, layers: Sequence[Layer], where: str) -> None:
    """Only a layer's residual stream leaves it, to the next layer (or, for the last, the ops after it); layers
    from 1 on read nothing of another layer but the residual before them (what layer 0 makes for all is shared)."""
    owner: dict[int, int] = {}
    for layer in layers:
        for i in layer.ops:
            for t in model.ops[i].outputs:
                owner[t] = layer.index
    for i, op in enumerate(model.ops):
        here = next((x.index for x in layers if i in x.ops), len(layers))  # len(layers): the ops after the layers
        for t in op.inputs:
            src = owner.get(t)
            if src is None or src == here or (src == 0 and here > 0 and t != layers[0].output):
                continue  # inside its layer, a graph input, or shared from layer 0
            if t == layers[src].output and here == src + 1:
                continue  # the residual stream into the next layer (or the ops after the last)
            raise RepeatError(
                f"{where}: op {op.name!r} (layer {here}) reads {model.tensor_names[t]!r} of layer {src}: only the "
                "residual stream may cross from one layer to the next"
            )


def layer_sources(exported: int, layers: int) -> list[int]:
    """Which exported layer each of ``layers`` copies: the exported ones as they are, then ``1 .. exported - 1`` in
    turn (layer 0 also computes the shared tensors, so it is never repeated)."""
    if exported < 2:
        raise RepeatError(f"repeating needs 2 or more exported layers, got {exported}")
    if layers < exported:
        raise RepeatError(f"--layers {layers}: fewer than the {exported} exported layers")
    if layers > MAX_LAYERS:
        raise RepeatError(f"--layers {layers}: more than {MAX_LAYERS}; expected a decoder's layer count")
    return list(range(exported)) + [1 + (i - 1) % (exported - 1) for i in range(exported, layers)]


def _renamed(name: str, source: int, layer: int) -> str:
    new = re.sub(rf"((?:^|/)(?:blocks|layers)\.){source}(?=/)", rf"\g<1>{layer}", name)
    return new if new != name else f"{name}#layer{layer}"


def _shifted(main: Any, shift: int) -> Any:
    main = copy.deepcopy(main)
    for table in external_tables(main):
        ext = [int(v) for v in table.external]
        ext[0] += shift
        table.external = ext
    return main


def repeat_model(model: MnnModel, layers: list[Layer], tail_start: int, count: int) -> tuple[MnnModel, list[KeptBlock]]:
    """``model`` with ``count`` layers (`layer_sources`), and the weight file's layout: the source's bytes up to
    ``tail_start`` where they were, each added layer's bytes after them, then the source's bytes from ``tail_start``
    (as blocks of a `WeightPlan`, in file order; the caller adds the tail's size)."""
    sources = layer_sources(len(layers), count)
    keep = layers[-1].last_op + 1
    new = copy.copy(model)
    new.tensor_names = list(model.tensor_names)
    new.ops = list(model.ops[:keep])
    new.extra_tensor_describe = list(model.extra_tensor_describe)
    describe = {d.index: d for d in model.extra_tensor_describe}
    blocks = [KeptBlock(0, 0, tail_start)]
    at = tail_start
    residual = layers[-1].output
    for i in range(len(layers), count):
        src = layers[sources[i]]
        prev = layers[src.index - 1].output
        shift = at - src.weights[0]
        renamed: dict[int, int] = {}
        for j in src.ops:
            op = model.ops[j]
            inputs = [residual if t == prev else renamed.get(t, t) for t in op.inputs]
            outputs = []
            for t in op.outputs:
                renamed[t] = new.add_tensor(_renamed(model.tensor_names[t], src.index, i))
                outputs.append(renamed[t])
                if t in describe:
                    d = copy.deepcopy(describe[t])
                    d.index = renamed[t]
                    new.extra_tensor_describe.append(d)
            main = _shifted(op.main, shift) if op.main is not None else None
            if op.type == ATTENTION:
                main.layerIndex = i
            new.ops.append(
                Op(
                    op.type,
                    _renamed(op.name, src.index, i),
                    inputs,
                    outputs,
                    main,
                    op.default_dimension_format,
                    op.external_path,
                )
            )
        residual = renamed[src.output]
        blocks.append(KeptBlock(src.weights[0], at, src.weight_bytes))
        at += src.weight_bytes
    delta = at - tail_start
    for op in model.ops[keep:]:
        inputs = [residual if t == layers[-1].output else t for t in op.inputs]
        main = _shifted(op.main, delta) if _op_ranges(op) else op.main
        new.ops.append(
            Op(op.type, op.name, inputs, list(op.outputs), main, op.default_dimension_format, op.external_path)
        )
    if len(set(new.tensor_names)) != len(new.tensor_names):
        raise RepeatError("renamed tensors collide with existing names")
    if new.tensor_number:
        new.tensor_number = len(new.tensor_names)
    return new, blocks


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def repeat_dir(src: Path, dest: Path, count: int, made: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``src``'s model with ``count`` layers into ``dest`` (replaced as a whole) and return its note
    (`NOTE_FILE`, with ``made`` added: how ``src`` was exported)."""
    src, dest = Path(src), Path(dest)
    if dest.resolve() == src.resolve():  # a model dir, so check_replaceable would let it be replaced
        raise RepeatError(f"--out {dest}: is the source model; expected another directory (the source is kept)")
    check_replaceable(dest)  # before the work, not after it
    for name in REFUSED_FILES:
        if (src / name).exists():
            raise RepeatError(f"{src / name}: a model with {name} is not repeated (its taps depend on the layers)")
    model_path, weight_path, cfg_path = src / MODEL_FILE, src / WEIGHT_FILE, src / LLM_CONFIG
    try:
        model = load_model(model_path)
        llm_cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RepeatError(f"{src}: cannot read the model: {exc}") from None
    layers, tail = find_layers(model, str(model_path))
    weight_size = weight_path.stat().st_size
    tie = tie_embeddings(llm_cfg, cfg_path)
    tie_range = tie.weight_range() if tie is not None else None
    tail_start = min(tail[0], tie_range.offset if tie_range else tail[0])
    if tail_start < layers[-1].weights[1]:
        raise RepeatError(f"{cfg_path}: field 'tie_embeddings' points into the layers' weights, not after them")
    new, blocks = repeat_model(model, layers, tail_start, count)
    delta = sum(b.size for b in blocks[1:])
    blocks.append(KeptBlock(tail_start, tail_start + delta, weight_size - tail_start))
    old_uuid = model.mnn_uuid or ""
    new.mnn_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"mnnbuild-repeat-layers:{old_uuid}:{count}"))

    per_layer = [k for k, v in llm_cfg.items() if isinstance(v, list) and len(v) == len(layers) and k not in FLAT_LISTS]
    if per_layer:
        raise RepeatError(f"{cfg_path}: field {per_layer[0]!r} may hold one entry per layer; not repeated")
    cfg = dict(llm_cfg)
    if tie is not None and tie.weight_offset:
        cfg = tie.moved(cfg, tie.weight_offset + delta)
    for field in LAYER_COUNT_FIELDS:
        if field in cfg:
            cfg[field] = count
    sources = layer_sources(len(layers), count)
    note = {
        "made_by": "models/export/repeat_layers.py",
        "how": f"{count} decoder layers from {len(layers)} exported ones: layers 0..{len(layers) - 1} as exported, "
        f"each further layer i a copy of exported layer 1 + (i - 1) % {len(layers) - 1} (its ops renamed, its "
        "weight bytes copied to offsets of its own); final norm and lm_head after the last layer",
        "exported_layers": len(layers),
        "layers": count,
        "layer_sources": sources,
        "layer_weight_bytes": [layers[s].weight_bytes for s in sources],
        "source": {
            "dir_name": src.name,
            "sha256": {n: _sha256(src / n) for n in (MODEL_FILE, WEIGHT_FILE, LLM_CONFIG)},
            "weight_file_bytes": weight_size,
        },
        "weight_file_bytes": weight_size + delta,
        **({"exported": made} if made else {}),
    }

    with staged_model_dir(dest) as staging:
        save_model(new, staging / MODEL_FILE)
        write_weights(WeightPlan(weight_path, weight_size, tuple(blocks)), staging / WEIGHT_FILE)
        (staging / LLM_CONFIG).write_text(json.dumps(cfg, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
        for name in COPIED_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, staging / name)
        (staging / NOTE_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
    LOG.info("%s: %d layers from %d exported (+%d weight bytes) -> %s", src, count, len(layers), delta, dest)
    return note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="an exported MNN LLM dir (llm.mnn, llm.mnn.weight, llm_config.json)")
    parser.add_argument("--layers", type=int, required=True, help="layers of the new model")
    parser.add_argument("--out", type=Path, required=True, help="the new model's dir (replaced as a whole)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        repeat_dir(args.src, args.out, args.layers)
    except (RepeatError, PublishError, MNNFormatError) as exc:
        raise SystemExit(f"repeat_layers: {exc}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
