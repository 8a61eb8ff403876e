"""Make the architecture zoo: a tiny random-weight model of every text model type llmexport 0.0.5 exports.

For each type in ``ZOO`` (the types llmexport registers that the installed transformers builds offline from a config,
plus phi3, mistral, glm4 and smollm3, which llmexport maps to the Llama layout): a 2-layer model with small dims from
``transformers.AutoConfig.for_model``, random weights (seeded), the test tokenizer of ``make_models``; exported with
llmexport (int4, block 64, asymmetric: llmexport's defaults) through ``make_models``' export path and converter shim.
Each model dir gets ``zoo.json``: what llmexport did (its model type in ``llm_config.json``, whether it knows the
type or maps it to Llama, the HF parameters whose names its map does not cover, its warnings).

Maintenance only, in the export venv (torch, transformers, llmexport); never run by CI or tests. Exports run in a
temp dir; models go to ``--out DIR/<type>``. ``zoo-summary.json`` in ``DIR`` lists every type with its outcome (a
type whose export fails is recorded with the error's last line, the others still run).

    python models/export/make_zoo.py --out /tmp/zoo                 # every type
    python models/export/make_zoo.py --out /tmp/zoo --only phi3 --only gemma2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_models as mm  # noqa: E402

LOG = logging.getLogger("make_zoo")

HIDDEN = 128
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
FFN = 256
LAYERS = 2
# --fixture: the dims of the test fixtures under tests/fixtures/models/zoo-* (a third of the size)
FIXTURE_DIMS = {"hidden_size": 64, "head_dim": 16, "intermediate_size": 128}


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: the HF model type and what its config needs beyond the common small dims."""

    model_type: str
    extra: dict[str, Any] = field(default_factory=dict)
    # Types llmexport does not register: it maps them to the Llama layout.
    llama_mapped: bool = False
    fix: Callable[[Any], None] | None = None  # adjust the built config (nested sub-configs)


def _layer_types(kinds: tuple[str, ...]) -> list[str]:
    return [kinds[i % len(kinds)] for i in range(LAYERS)]


ZOO: tuple[ZooModel, ...] = (
    ZooModel("llama"),
    ZooModel("qwen2"),
    ZooModel("qwen3"),
    ZooModel(
        "qwen3_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
    ),
    ZooModel(
        "gemma2",
        {
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 16,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
        },
    ),
    ZooModel("gemma3_text", {"query_pre_attn_scalar": HEAD_DIM, "sliding_window": 8, "sliding_window_pattern": 2}),
    ZooModel(
        "lfm2",
        {
            "layer_types": ["conv", "full_attention"],
            "block_ff_dim": FFN,
            "conv_L_cache": 3,
            "block_auto_adjust_ff_dim": False,
            "norm_eps": 1e-5,
        },
    ),
    ZooModel(
        "lfm2_moe",
        {
            "layer_types": ["conv", "full_attention"],
            "conv_L_cache": 3,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "num_dense_layers": 1,
            "norm_eps": 1e-5,
        },
    ),
    ZooModel("phi", {"partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5}),
    ZooModel("hunyuan_v1_dense", {"use_qk_norm": True}),
    ZooModel(
        "gpt_oss",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
            "layer_types": _layer_types(("sliding_attention", "full_attention")),
        },
    ),
    ZooModel(
        "llama4_text",
        {
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "intermediate_size_mlp": FFN,
            "interleave_moe_layer_step": 1,
            "no_rope_layers": [1, 0],
        },
    ),
    ZooModel("phi3", llama_mapped=True),
    ZooModel("mistral", llama_mapped=True),
    ZooModel("glm4", {"partial_rotary_factor": 0.5}, llama_mapped=True),
    ZooModel("smollm3", llama_mapped=True),
)


def common_config(vocab_size: int) -> dict[str, Any]:
    """The small dims every zoo model shares (types ignore the keys they do not know)."""
    tok_ids = {t: i for i, t in enumerate(mm.SPECIAL_TOKENS)}
    return {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": tok_ids[mm.ENDOFTEXT],
        "eos_token_id": tok_ids[mm.IM_END],
        "pad_token_id": None,
        "initializer_range": 0.02,
    }


def zoo_spec(entry: ZooModel) -> mm.ModelSpec:
    """The ``make_models`` spec llmexport's runner reads (name, quantization)."""
    return mm.ModelSpec(
        name=f"zoo-{entry.model_type}",
        dest="",
        arch=entry.model_type,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        intermediate_size=FFN,
        tie_embeddings=True,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose=f"architecture zoo: {entry.model_type}",
    )


def build_hf(entry: ZooModel, seed: int, vocab_size: int, hf_dir: Path, fixture: bool) -> dict[str, int]:
    """Build and save the random-weight HF model (RMSNorm weights perturbed as in ``make_models``); return how many
    Linear and norm modules it has (to compare with what the export holds)."""
    import torch
    import transformers

    kwargs = {**common_config(vocab_size), **entry.extra, **(FIXTURE_DIMS if fixture else {})}
    if fixture and "block_ff_dim" in kwargs:
        kwargs["block_ff_dim"] = FIXTURE_DIMS["intermediate_size"]
    config = transformers.AutoConfig.for_model(entry.model_type, **kwargs)
    if entry.fix is not None:
        entry.fix(config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(hf_dir, safe_serialization=True)
    modules = list(model.modules())
    return {
        "linears": sum(isinstance(m, torch.nn.Linear) for m in modules),
        "norms": sum(type(m).__name__.endswith(("RMSNorm", "LayerNorm")) for m in modules),
    }


def llmexport_types() -> set[str]:
    """The model types llmexport's model map registers."""
    exp_dir = str(mm.llmexport_dir())
    if exp_dir not in sys.path:
        sys.path.insert(0, exp_dir)
    from utils.model_mapper import ModelMapper  # llmexport's own package layout (see make_models.run_llmexport)

    return set(ModelMapper().mapper)


def record(
    entry: ZooModel, known: set[str], out_dir: Path, hf_dir: Path, log_text: str, hf_counts: dict[str, int]
) -> dict[str, Any]:
    """What llmexport did with the model: its type, the Llama mapping, the warnings it printed, and the HF model's
    Linear and norm modules against the export's Convolution and LayerNorm ops (fewer norms: it dropped some)."""
    if str(mm.REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(mm.REPO_ROOT))
    from mnnbuild.mnn import load_model  # the project's reader (flatbuffers only)

    graph = load_model(out_dir / "llm.mnn")
    counts = graph.op_type_counts()
    norm_eps = sorted({float(op.main.epsilon) for op in graph.ops_of_type("LayerNorm") if op.main is not None})
    llm_cfg = json.loads((out_dir / "llm_config.json").read_text(encoding="utf-8"))
    hf_cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    warnings = sorted({line.strip() for line in log_text.splitlines() if "warn" in line.lower()})[:20]
    return {
        "model_type": entry.model_type,
        "architectures": hf_cfg.get("architectures"),
        "llmexport_registers": entry.model_type in known,
        "llmexport_layout": entry.model_type if entry.model_type in known else "llama (unregistered type)",
        "llm_config": {k: llm_cfg[k] for k in sorted(llm_cfg) if k not in ("tie_embeddings", "jinja")},
        "warnings": warnings,
        "hf_modules": hf_counts,
        "mnn_ops": {"Convolution": counts.get("Convolution", 0), "LayerNorm": counts.get("LayerNorm", 0)},
        "norm_epsilons": norm_eps,
        "dropped_norms": max(0, hf_counts["norms"] - counts.get("LayerNorm", 0)),
        "op_types": sorted(counts),
    }


def make_one(
    entry: ZooModel, seed: int, tokenizer: Any, known: set[str], dest: Path, keep_tmp: bool, fixture: bool = False
) -> dict:
    """Build, export and publish one zoo model into ``dest``; return its record."""
    spec = zoo_spec(entry)
    if fixture:
        spec = dataclasses.replace(spec, hidden_size=FIXTURE_DIMS["hidden_size"])
    work = Path(tempfile.mkdtemp(prefix=f"mnnbuild-zoo-{entry.model_type}-"))
    try:
        hf_dir = work / "hf"
        hf_dir.mkdir()
        vocab_size = mm.save_tokenizer(tokenizer, hf_dir)
        hf_counts = build_hf(entry, seed, vocab_size, hf_dir, fixture)
        out_dir = work / "mnn"
        shim = mm.write_mnnconvert_shim(work)
        mm.run_llmexport(spec, hf_dir, out_dir, work, shim)
        mm.pin_model_uuid(spec, seed, out_dir / "llm.mnn")
        log_file = work / ".export.log"
        info = record(
            entry, known, out_dir, hf_dir, log_file.read_text(errors="replace") if log_file.exists() else "", hf_counts
        )
        (out_dir / "zoo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        mm.publish_outputs(out_dir, dest, extra=("zoo.json",))
        return {**info, "status": "exported"}
    finally:
        if keep_tmp:
            LOG.info("kept temporary dir %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


class _LastError(logging.Handler):
    """Keeps the last ``SomethingError: ...`` line ``make_models`` logs from llmexport's output."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        for line in record.getMessage().splitlines():
            head = line.split(":", 1)[0]
            if head.endswith(("Error", "Exception")) and " " not in head:
                self.line = line.strip()


def not_in_zoo(known: set[str]) -> dict[str, dict[str, Any]]:
    """The types llmexport registers that the zoo does not make, and why."""
    from transformers import CONFIG_MAPPING

    made = {z.model_type for z in ZOO}
    return {
        t: {
            "model_type": t,
            "status": "not in the zoo",
            "llmexport_registers": True,
            "why": "the installed transformers has no such config (remote code only)"
            if t not in CONFIG_MAPPING
            else "not a text-only causal LM (vision, audio or speech model, or a wrapper of one)",
        }
        for t in sorted(known - made)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for the models (one subdir per type)")
    parser.add_argument("--only", action="append", choices=[z.model_type for z in ZOO], help="only these types")
    parser.add_argument("--fixture", action="store_true", help="the smaller dims of the test fixtures")
    parser.add_argument("--seed", type=int, default=mm.DEFAULT_SEED, help="seed for tokenizer text and weights")
    args = mm.parse_export_args(parser, argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = mm.train_tokenizer(args.seed, 1024)
    known = llmexport_types()
    summary_path = out / "zoo-summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    summary.update(not_in_zoo(known))
    last_error = _LastError()
    logging.getLogger("make_models").addHandler(last_error)
    for entry in ZOO:
        if args.only and entry.model_type not in args.only:
            continue
        LOG.info("== %s", entry.model_type)
        last_error.line = ""
        try:
            summary[entry.model_type] = make_one(
                entry, args.seed, tokenizer, known, out / entry.model_type, args.keep_tmp, args.fixture
            )
        except (Exception, SystemExit) as exc:  # one type failing must not stop the others
            LOG.debug("%s", traceback.format_exc())
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
            if last_error.line:
                last = f"{last}: {last_error.line[:300]}"
            LOG.error("%s: export failed: %s", entry.model_type, last)
            summary[entry.model_type] = {
                "model_type": entry.model_type,
                "status": "export failed",
                "error": last,
                "llmexport_registers": entry.model_type in known,
            }
        tmp = summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(summary_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
