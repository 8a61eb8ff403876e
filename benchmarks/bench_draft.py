"""What an Eagle3 draft costs on the CPU next to the target it drafts for: time and weight bytes, at real dims.

MNN's engine (``speculative_decoding/eagle.cpp``, ``topkGenerate``) runs per speculative cycle, after the target's
verifying forward has accepted ``a`` tokens (1 .. ``draft_predict_length`` + 1): ``eagle_fc`` over the ``a`` accepted
rows of the target's ``hidden_states``, one ``eagle`` forward over those ``a`` rows (the draft's lm_head on the last
row only), then ``eagle_depth`` - 1 more ``eagle`` forwards of ``eagle_topk`` rows each (lm_head on every row). This
script times those forwards with PyPI MNN on the CPU, the draft's lm_head alone (its sub-graph), and one target decode
forward (``llm.mnn``, one row) on the CPU, all with the engine's settings from the model's ``config.json``
(``precision``, ``memory``: ``low`` keeps quantized weights as stored) and interleaved round by round so the shared
box's load falls on all alike; it reports medians. Bytes read are the weight-file bytes each graph's ops read
(every weight once, as stored).

What it leaves out: the draft's and the target's KV cache (each forward here sees only its own rows; for one draft
layer the cached rows add an attention over the context, small next to the weights at short contexts), the embedding
lookups and the engine's own bookkeeping (top-k, tree).

    MODELS_CACHE=... python benchmarks/bench_draft.py --layers 28            # qwen3-1.7b-eagle-L28 (bench_scale's)
    python benchmarks/bench_draft.py --model-dir DIR [--rounds 7] [--threads 2]

Results go to ``benchmarks/results/draft.json`` under the model dir's name.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, add_result, checkout_commit, print_table  # noqa: E402
from bench_scale import cache_args, ensure_model, projection  # noqa: E402

from mnnbuild.base.errors import MNNFormatError  # noqa: E402
from mnnbuild.base.native import native_output  # noqa: E402
from mnnbuild.cpu import forward_vars, import_mnn, load_module, to_numpy, to_var  # noqa: E402
from mnnbuild.mnn import conv_ops, embedding_info, external_ranges, load_model  # noqa: E402
from mnnbuild.mnn.llm import (  # noqa: E402
    DEFAULT_DRAFT_LENGTH,
    DEFAULT_WEIGHT,
    DRAFT_LENGTH_FIELD,
    EAGLE_FILE_FIELDS,
    EAGLE_TREE_DEFAULTS,
    MODEL_CONFIG,
    causal_mask,
)
from mnnbuild.mnn.summary import op_parameter_count  # noqa: E402

MEMORY_MODES = {"normal": 0, "high": 1, "low": 2}
"""MNN's ``BackendConfig::MemoryMode`` by the engine config's ``memory`` names."""
EAGLE_INPUTS = ["input_embed", "hidden_states", "attention_mask", "position_ids", "logits_index"]
EAGLE_OUTPUTS = ["logits", "out_hidden_states"]
LAST, ALL = -1, 0
"""``logits_index`` values the engine feeds: the last row's logits, every row's."""
SCALE_JSON = RESULTS / "scale.json"


def runtime(config: dict[str, Any], threads: int, weight_file: Path) -> Any:
    """A CPU RuntimeManager with the engine's precision and memory mode for this model, reading ``weight_file``."""
    nn = import_mnn().nn
    settings = {
        "backend": "CPU",
        "precision": config.get("precision", "low"),
        "memory": MEMORY_MODES[config.get("memory", "low")],
        "numThread": threads,
    }
    with native_output("MNN (runtime manager)"):
        rt = nn.create_runtime_manager((settings,))
    rt.set_external(str(weight_file))
    return rt


def weight_bytes(model_file: Path) -> dict[str, Any]:
    """Bytes of the weight file the model's ops read (each once), its convolutions' parameters, and the largest
    convolution (a draft's lm_head: its vocabulary is wider than any of its layer's outputs)."""
    model = load_model(model_file)
    convs = conv_ops(model)
    biggest = max(convs, key=lambda op: int(op.main.common.outputCount))
    readers = {r.reader: r.size for r in external_ranges(model)}
    return {
        "model": model,
        "bytes": sum(readers.values()),
        "params": sum(op_parameter_count(op) for op in convs),
        "biggest": biggest,
        "biggest_bytes": readers.get(f"op {biggest.name!r}", 0),
        "biggest_params": op_parameter_count(biggest),
    }


def head_input(model: Any, conv: Any) -> str:
    """The tensor the lm_head's sub-graph is cut from: the conv's input, before the layout conversion MNN puts in
    front of a Convolution (so the module is fed a plain tensor)."""
    name = model.tensor_names[conv.inputs[0]]
    producer = next((op for op in model.ops if conv.inputs[0] in op.outputs), None)
    if producer is not None and producer.type == "ConvertTensor":
        name = model.tensor_names[producer.inputs[0]]
    return name


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="an Eagle-exported model dir (llm.mnn, eagle*.mnn, config.json)")
    parser.add_argument("--layers", type=int, default=28, help="without --model-dir: bench_scale's eagle model")
    cache_args(parser)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (each runs every forward once)")
    parser.add_argument("--threads", type=int, default=2, help="MNN CPU threads (the engine's thread_num on a phone)")
    args = parser.parse_args(argv)
    if args.model_dir is None:
        if args.models_cache is None:
            parser.error("give --model-dir, or --models-cache / $MODELS_CACHE with --layers")
        model_dir = ensure_model(args.layers, args.models_cache, args.export_python, eagle=True)
    else:
        model_dir = args.model_dir
    config_path = model_dir / MODEL_CONFIG
    if not config_path.is_file():
        raise SystemExit(f"{config_path}: not found; --model-dir must be an exported model dir")
    config = json.loads(config_path.read_text())
    if config.get("speculative_type") != "eagle":
        raise SystemExit(f"{config_path}: field 'speculative_type' is {config.get('speculative_type')!r}, not 'eagle'")
    files = {k: model_dir / config.get(k, v) for k, v in EAGLE_FILE_FIELDS.items()}
    target_file = model_dir / config.get("llm_model", "llm.mnn")
    depth = int(config.get("eagle_depth", EAGLE_TREE_DEFAULTS["eagle_depth"]))
    topk = int(config.get("eagle_topk", EAGLE_TREE_DEFAULTS["eagle_topk"]))
    verify_len = int(config.get(DRAFT_LENGTH_FIELD, DEFAULT_DRAFT_LENGTH)) + 1

    for path in (target_file, *files.values()):
        if not path.is_file():
            raise SystemExit(f"{config_path}: names {path.name} but {path} does not exist")
    try:
        target, draft, fc = (weight_bytes(p) for p in (target_file, files["eagle_model"], files["eagle_fc"]))
    except MNNFormatError as exc:
        raise SystemExit(str(exc)) from None
    head = draft["biggest"]
    tmodel = target["model"]
    hidden = embedding_info(model_dir).hidden
    tap_width = int(fc["biggest"].main.common.inputCount)
    draft_vocab = int(head.main.common.outputCount)

    rng = np.random.default_rng(0)
    t_rt = runtime(config, args.threads, model_dir / config.get("llm_weight", DEFAULT_WEIGHT))
    t_mod = load_module(target_file, t_rt, tmodel.input_names, ["logits"])
    d_rt = runtime(config, args.threads, Path(f"{files['eagle_model']}.weight"))
    d_mod = load_module(files["eagle_model"], d_rt, EAGLE_INPUTS, EAGLE_OUTPUTS)
    cut = head_input(draft["model"], head)
    h_mod = load_module(files["eagle_model"], d_rt, [cut], [draft["model"].tensor_names[head.outputs[0]]])
    f_mod = load_module(files["eagle_fc"], runtime(config, args.threads, Path(f"{files['eagle_fc']}.weight")),
                        ["fc_hidden"], ["hidden_states"])  # fmt: skip

    def target_forward() -> None:
        feeds = {
            "input_ids": rng.standard_normal((1, 1, hidden), dtype=np.float32) * 0.02,
            "attention_mask": causal_mask(1),
            "position_ids": np.zeros((1, 1), dtype=np.int32),
            "logits_index": np.array([LAST], dtype=np.int32),
        }
        (out,) = forward_vars(t_mod, [to_var(feeds[n]) for n in tmodel.input_names])
        to_numpy(out)

    def fc_forward(rows: int) -> None:
        (out,) = forward_vars(f_mod, [to_var(rng.standard_normal((1, rows, tap_width), dtype=np.float32))])
        to_numpy(out)

    def draft_forward(rows: int, logits: int) -> None:
        mask = np.where(np.tril(np.ones((rows, rows), dtype=bool)), 0.0, np.finfo(np.float32).min)
        feed = [
            to_var(rng.standard_normal((rows, 1, hidden), dtype=np.float32) * 0.02),
            to_var(rng.standard_normal((1, rows, hidden), dtype=np.float32)),
            to_var(mask.astype(np.float32).reshape(1, 1, rows, rows)),
            to_var(np.arange(rows, dtype=np.int32).reshape(1, rows)),
            to_var(np.array([logits], dtype=np.int32)),
        ]
        for out in forward_vars(d_mod, feed):
            to_numpy(out)

    def head_forward(rows: int) -> None:
        (out,) = forward_vars(h_mod, [to_var(rng.standard_normal((rows, hidden), dtype=np.float32))])
        if to_numpy(out).size != rows * draft_vocab:  # the cut is not the lm_head alone
            raise SystemExit(f"{files['eagle_model']}: the sub-graph from {cut!r} is not a {draft_vocab}-wide lm_head")

    accepts = list(range(1, verify_len + 1))
    cases: dict[str, Callable[[], None]] = {"target 1 row": target_forward}
    for a in accepts:
        cases[f"fc {a} rows"] = lambda a=a: fc_forward(a)
        cases[f"draft {a} rows, last logits"] = lambda a=a: draft_forward(a, LAST)
    cases[f"draft {topk} rows, all logits"] = lambda: draft_forward(topk, ALL)
    cases["lm_head 1 row"] = lambda: head_forward(1)
    if topk > 1:
        cases[f"lm_head {topk} rows"] = lambda: head_forward(topk)
    for fn in cases.values():  # warm-up: MNN resizes and packs on a module's first run of a shape
        fn()
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            seconds[name].append(timed(fn))
    ms = {k: round(statistics.median(v) * 1e3, 2) for k, v in seconds.items()}
    low = {k: round(min(v) * 1e3, 2) for k, v in seconds.items()}

    def cycle_ms(a: int, of: dict[str, float] = ms) -> float:
        """The engine's draft work per cycle after ``a`` accepted tokens."""
        return (
            of[f"fc {a} rows"] + of[f"draft {a} rows, last logits"] + (depth - 1) * of[f"draft {topk} rows, all logits"]
        )

    layer_bytes = draft["bytes"] - draft["biggest_bytes"]
    draft_forwards = depth
    cycle_bytes = fc["bytes"] + draft_forwards * draft["bytes"]
    result: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": checkout_commit(),
        "settings": {
            "precision": config.get("precision", "low"),
            "memory": config.get("memory", "low"),
            "threads": args.threads,
            "rounds": args.rounds,
        },
        "dims": {
            "hidden": hidden,
            "tap_width": tap_width,
            "draft_vocab": draft_vocab,
            "layers": sum(op.type == "Attention" for op in tmodel.ops),
        },
        "engine": {
            "eagle_topk": topk,
            "eagle_depth": depth,
            "verify_length": verify_len,
            "draft_forwards_per_cycle": draft_forwards,
            "note": "per cycle: eagle_fc over the a accepted rows, eagle over them (last logits), then depth - 1 "
            "eagle forwards of topk rows (all logits)",
        },
        "median_ms": ms,
        "all_ms": {k: [round(s * 1e3, 2) for s in v] for k, v in seconds.items()},
        "draft_cycle_ms": {str(a): round(cycle_ms(a), 2) for a in accepts},
        "draft_cycle_min_ms": {str(a): round(cycle_ms(a, low), 2) for a in accepts},
        "bytes": {
            "target_forward": target["bytes"],
            "target_params": target["params"],
            "target_lm_head_params": target["biggest_params"],
            "draft_forward": draft["bytes"],
            "draft_params": draft["params"],
            "draft_lm_head": draft["biggest_bytes"],
            "draft_lm_head_params": draft["biggest_params"],
            "draft_layer": layer_bytes,
            "fc": fc["bytes"],
            "fc_params": fc["params"],
            "draft_cycle": cycle_bytes,
            "draft_files": sum(p.stat().st_size for p in model_dir.glob("eagle*") if p.is_file()),
        },
    }
    result["ratios"] = (
        {f"draft_cycle_a{a}_over_target_forward_time": round(cycle_ms(a) / ms["target 1 row"], 3) for a in accepts}
        | {
            f"draft_cycle_a{a}_over_target_forward_min_time": round(cycle_ms(a, low) / low["target 1 row"], 3)
            for a in accepts
        }
        | {
            "draft_cycle_over_target_forward_bytes": round(cycle_bytes / target["bytes"], 3),
            "lm_head_over_draft_forward_time": round(ms["lm_head 1 row"] / ms[f"draft {topk} rows, all logits"], 3),
            "lm_head_over_draft_forward_bytes": round(draft["biggest_bytes"] / draft["bytes"], 3),
        }
    )
    result["npu_projection"] = npu_projection(result, model_dir.name)
    report(result)
    path = add_result("draft", model_dir.name, result)
    sys.stdout.write(f"wrote {path} ({model_dir.name})\n")


def npu_projection(result: dict[str, Any], model_name: str) -> dict[str, Any] | None:
    """PROJECTION, not a measurement: the draft's layer and lm_head as QNN plugins, from the latest ``--eagle`` run
    of the same model size in ``scale.json`` (its per-plugin context seconds and NPU bytes per weight). None without
    such a run. The target's last two plugins there are its lm_head (split in two by ``max_plugin_parameters``)."""
    if not SCALE_JSON.is_file():
        return None
    key = f"{result['dims']['layers']}-int4"
    runs = [r for by_key in json.loads(SCALE_JSON.read_text()).get("speculative", {}).values()
            for k, r in by_key.items() if k == key and "context" in r["runs"]["eagle"]["stages"]]  # fmt: skip
    b, forwards = result["bytes"], result["engine"]["draft_forwards_per_cycle"]
    if not runs or result["dims"]["layers"] < 7:
        return None
    eagle = runs[-1]["runs"]["eagle"]
    plugins = eagle["stages"]["context"]["plugins_s"]
    w = eagle["weights"]
    weights = sum(e["weights"] for e in w["by_encoding"].values())
    if abs(weights - b["target_params"]) > 0.01 * weights:  # another model than the one measured here
        return None
    npu_bytes_per_weight = w["npu_weight_bytes_per_decoded_token"] / weights
    names = sorted(plugins, key=lambda n: int("".join(c for c in n if c.isdigit()) or 0))
    layer_s = statistics.median(plugins[n] for n in names[1:-3])  # the layer plugins (first and last three aside)
    head_s = plugins[names[-1]] + plugins[names[-2]]
    target_layer_params = (b["target_params"] - b["target_lm_head_params"]) / result["dims"]["layers"]
    layer_params = b["draft_params"] - b["draft_lm_head_params"]
    head_params = b["draft_lm_head_params"]
    layer_extra = layer_s * layer_params / target_layer_params
    head_extra = head_s * head_params / b["target_lm_head_params"]
    context_s = eagle["stages"]["context"]["stage_s"]
    npu_draft_bytes = round((layer_params + head_params) * npu_bytes_per_weight)
    target_bytes = w["npu_weight_bytes_per_decoded_token"]
    topk, verify_len = result["engine"]["eagle_topk"], result["engine"]["verify_length"]
    rows_fed = sorted({*range(1, verify_len + 1), topk})  # the first forward's accepted rows, then topk rows
    head_rows = {1, topk}
    graphs = 2 * len(rows_fed) + len(head_rows)
    out = {
        "label": f"PROJECTION from scale.json's {key} eagle run: context seconds of its layer and lm_head plugins "
        "scaled by parameters; NPU bytes at its bytes per weight",
        "npu_bytes_per_weight": round(npu_bytes_per_weight, 4),
        "context_binary_bytes_extra": npu_draft_bytes,
        "context_s_extra": round(layer_extra + head_extra, 1),
        "context_s_extra_layer": round(layer_extra, 1),
        "context_s_extra_lm_head": round(head_extra, 1),
        "context_stage_s": context_s,
        "context_extra_fraction": round((layer_extra + head_extra) / context_s, 3),
        "plugins_extra": 3,
        "graphs_extra": graphs,
        "graphs_note": "the attention (tree mask, the draft's KV cache) and the logits_index slice stay on the CPU, as "
        "the target's do: plugins before and after the attention at every row count the engine feeds the draft "
        f"({rows_fed}; a QNN graph runs only its own input shape), the lm_head after the slice at {sorted(head_rows)}",
        "npu_bytes_per_cycle_extra": npu_draft_bytes * forwards,
        "npu_target_bytes_per_forward": target_bytes,
        "npu_bytes_per_cycle_extra_fraction": round(npu_draft_bytes * forwards / target_bytes, 3),
        "plugin_calls_per_cycle_extra": 3 * forwards,
        "plugin_calls_per_target_forward": len(plugins),
        "model": model_name,
    }
    cpu, npu = projection(target_bytes), projection(target_bytes + npu_draft_bytes * forwards)
    if cpu and npu:  # with the tiny trained pair's acceptance, as bench_scale projects it
        out["npu_bytes_per_generated_token"] = {
            "accepted_per_forward": cpu["accepted_per_forward"],
            "draft_on_cpu": cpu["npu_weight_bytes_per_generated_token"],
            "draft_on_npu": npu["npu_weight_bytes_per_generated_token"],
            "cpu_bytes_per_generated_token_draft_on_cpu": round(b["draft_cycle"] / cpu["accepted_per_forward"]),
            "cpu_bytes_per_generated_token_draft_on_npu": round(b["fc"] / cpu["accepted_per_forward"]),
        }
    return out


def report(r: dict[str, Any]) -> None:
    ms, b = r["median_ms"], r["bytes"]
    rows = [(k, v, min(r["all_ms"][k])) for k, v in ms.items()]
    print_table(["forward (CPU)", "median ms", "min ms"], rows)
    out = sys.stdout.write
    e = r["engine"]
    out(f"settings: {r['settings']}; dims: {r['dims']}; engine: topk {e['eagle_topk']}, depth {e['eagle_depth']}, "
        f"verify length {e['verify_length']}\n")  # fmt: skip
    mb = {k: round(v / 1e6, 1) for k, v in b.items() if not k.endswith("params")}
    out(f"weight MB read: {mb}\n")
    out(f"draft cycle (fc + eagle(a) + (depth-1) x eagle(topk)), ms by accepted a: medians {r['draft_cycle_ms']}, "
        f"minimums {r['draft_cycle_min_ms']}\n")  # fmt: skip
    out(f"ratios: {r['ratios']}\n")
    if r.get("npu_projection"):
        out(f"NPU PROJECTION: {r['npu_projection']}\n")


if __name__ == "__main__":
    main()
