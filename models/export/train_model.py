#!/usr/bin/env python3
"""Train the tiny Qwen3 of ``models/tiny-qwen3-trained`` here, on the CPU, and export it with PyPI ``llmexport``.

The random-weight test models compute nothing: their greedy tokens repeat one id and near-ties decide most of
their top-1 picks, so an accuracy number measured on them says little. This model is trained, in minutes on one
CPU thread, on text that ships with the ``export`` extra's pinned torch: the docstrings torch 2.13.0 attaches to
its functions (the ``add_docstr`` calls of ``torch/_torch_docs.py``) and to the ``torch.nn`` modules, with the
reST markup, formulas and code examples left out. The docstrings' sha256 is recorded below: another torch's text
is refused, so the model cannot silently change.

Steps: extract and clean the text; train a byte-level BPE tokenizer on it (``make_models.bpe_tokenizer``, the
tiny models' recipe); train a ``Qwen3ForCausalLM`` (seeded init, seeded batches, AdamW, warmup + cosine);
export it with llmexport's default quantization (int4, block 64, asymmetric) through ``make_models`` (the
telemetry-free converter shim, pinned UUID, MNN vs HF logits check); write the model dir with a README, a
``training.json`` (settings, losses, time, versions, file hashes) and ``corpus-words.txt`` (every word of the
training text, which the tests check generated text against: the corpus itself is not shipped).

Deterministic: seeds fixed, ``torch.use_deterministic_algorithms``, intra- and inter-op threads pinned (one by
default: on a shared 2-core box one thread also trains fastest). Given the same versions and CPU, two runs give
the same weights; byte identity across torch versions or CPUs (other SIMD kernels) is not promised.

Maintenance only (``pip install -e '.[export]'``): never run by CI or tests.

    python models/export/train_model.py [--out DIR] [--steps N] [--threads N] [--keep-tmp] [-v]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import json
import logging
import math
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

SCRIPT_DIR = Path(__file__).resolve().parent
if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))

import make_models  # noqa: E402  (the sibling script: tokenizer, HF config, llmexport, checks)

LOG = logging.getLogger("train_model")

TORCH_VERSION = "2.13.0"
CORPUS_SHA256 = "e85ff625cd3c886b8ec4c8a06535df6f69b364e670fc0eab52c185f004670d1b"
"""sha256 of the raw docstrings (:func:`raw_documents`, joined by :data:`DOC_JOIN`) of torch 2.13.0."""
DOC_JOIN = "\n\x1e\n"

WORDS_FILE = "corpus-words.txt"
TRAINING_FILE = "training.json"
README_FILE = "README.md"

MODEL = make_models.ModelSpec(
    name="tiny-qwen3-trained",
    dest="models/tiny-qwen3-trained",
    arch="qwen3",
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=384,
    tie_embeddings=True,
    quant_bit=4,
    quant_block=64,
    symmetric=False,
    purpose="trained Qwen3 for accuracy checks (tied embeddings, int4 block 64 asymmetric: llmexport's default)",
)


@dataclass(frozen=True)
class Training:
    """How the model is trained (recorded in ``training.json``)."""

    seed: int = 20251202
    vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 800
    peak_lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    held_out_every: int = 20
    """Every this-many-th document (from the first) is held out of training and measures the loss."""
    eval_windows: int = 64
    log_every: int = 50
    threads: int = 1


# ---- the corpus --------------------------------------------------------------------------------------------


def raw_documents() -> list[str]:
    """torch's own documentation as torch attaches it: the docstring of each ``add_docstr`` target of
    ``torch/_torch_docs.py`` (file order), then by module (:data:`DOC_MODULES`) and name the public ``torch.nn``
    module classes, functions of ``torch.nn.functional``, ``torch.linalg``, ``torch.fft``, ``torch.special`` and
    ``torch.optim`` optimizers; a text seen before (an alias) once."""
    import importlib

    import torch

    if torch.__version__.split("+")[0] != TORCH_VERSION:
        raise SystemExit(
            f"torch {torch.__version__}: the corpus is torch {TORCH_VERSION}'s docstrings (pip install -e '.[export]')"
        )
    source = Path(torch.__file__).parent / "_torch_docs.py"
    docs = []
    for node in ast.walk(ast.parse(source.read_bytes(), str(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "add_docstr":
            target: Any = torch
            for part in ast.unparse(node.args[0]).split(".")[1:]:
                target = getattr(target, part)
            docs.append(target.__doc__ or "")
    for module_name, kind in DOC_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(dir(module)):
            obj = getattr(module, name)
            if name.startswith("_") or not obj.__doc__ or not _is_documented(obj, kind):
                continue
            doc = inspect.cleandoc(obj.__doc__)
            if doc not in docs:
                docs.append(doc)
    return docs


DOC_MODULES = (
    ("torch.nn", "module"),
    ("torch.nn.functional", "function"),
    ("torch.linalg", "function"),
    ("torch.fft", "function"),
    ("torch.special", "function"),
    ("torch.optim", "optimizer"),
)


def _is_documented(obj: object, kind: str) -> bool:
    import torch

    if not (getattr(obj, "__module__", None) or "").startswith("torch"):
        return False  # imported from elsewhere (typing.Optional): another package's text
    if kind == "module":
        return inspect.isclass(obj) and issubclass(obj, torch.nn.Module)
    if kind == "optimizer":
        return inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer)
    return callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj)


def checked_documents() -> list[str]:
    """:func:`raw_documents`, refused unless they are the text this model was trained on."""
    docs = raw_documents()
    digest = hashlib.sha256(DOC_JOIN.join(docs).encode("utf-8")).hexdigest()
    if digest != CORPUS_SHA256:
        raise SystemExit(
            f"torch's docstrings have sha256 {digest}, expected {CORPUS_SHA256}: not the text this model is trained "
            f"on (torch {TORCH_VERSION} of the export extra)"
        )
    return docs


_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")
_ROLE = re.compile(r":(\w+):`~?([^`<]*?)\s*(?:<[^>]*>)?`")
_MATH_ROLE = re.compile(r":math:`([^`]*)`")
_TEX = re.compile(r"\\[A-Za-z]+|[\\{}]")
_KEPT_DIRECTIVES = (".. note::", ".. warning::", ".. seealso::")


def clean_document(doc: str) -> str:
    """The prose of one reST docstring: no signature lines, formulas, literal blocks (examples) or ``>>>`` lines;
    roles, backquotes and bold reduced to their text; each paragraph on one line."""
    kept: list[str] = []
    block_indent: int | None = None  # inside a literal block / directive body that is dropped
    for line in doc.splitlines():
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if not text or indent > block_indent:
                continue
            block_indent = None
        if text.startswith((">>>", "...")) or _SIGNATURE.match(text):
            continue
        if text.startswith(_KEPT_DIRECTIVES):  # an admonition: its body is prose
            rest = text.split("::", 1)[1].strip()
            if rest:
                kept.append(rest)
            continue
        if text.endswith("::") or text.startswith(".. "):
            block_indent = indent
            lead = text[:-2].rstrip() if text.endswith("::") else ""
            if lead and not text.startswith(".. ") and not lead.lower().startswith("example"):
                kept.append(lead + ":")
            continue
        kept.append(text)
    body = "\n".join(kept)
    body = _MATH_ROLE.sub(lambda m: _TEX.sub("", m.group(1)), body)
    body = _ROLE.sub(lambda m: m.group(2), body).replace("``", "").replace("`", "").replace("**", "")
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", body))
    return "\n".join(p for p in paragraphs if p)


def split_documents(docs: Sequence[str], every: int) -> tuple[list[str], list[str]]:
    """(training, held-out) documents: every ``every``-th one, from the first, is held out."""
    return [d for i, d in enumerate(docs) if i % every], [d for i, d in enumerate(docs) if not i % every]


def corpus_words(docs: Sequence[str]) -> list[str]:
    """Every word (run of letters) of ``docs``, lower-cased, sorted."""
    return sorted({w.lower() for d in docs for w in re.findall(r"[A-Za-z]+", d)})


# ---- training ----------------------------------------------------------------------------------------------


def token_stream(tokenizer: Tokenizer, docs: Sequence[str]) -> torch.Tensor:
    """The documents' token ids, each document followed by ``<|endoftext|>``, as one int64 tensor."""
    import torch

    eot = tokenizer.token_to_id(make_models.ENDOFTEXT)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(list(docs), add_special_tokens=False):
        ids += [*enc.ids, eot]
    return torch.tensor(ids, dtype=torch.int64)


def windows(stream: torch.Tensor, starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    import torch

    return stream[starts[:, None] + torch.arange(seq_len)[None, :]]


def learning_rate(step: int, cfg: Training) -> float:
    """Linear warmup, then cosine from ``peak_lr`` down to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.peak_lr * (step + 1) / cfg.warmup_steps
    done = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + (cfg.peak_lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * done))


def mean_loss(model: torch.nn.Module, batches: torch.Tensor) -> float:
    """Mean next-token loss over ``batches`` [n, seq] (eval mode, no grad)."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [float(model(input_ids=b[None], labels=b[None]).loss) for b in batches]
    model.train(was_training)
    return sum(losses) / len(losses)


def train(model: torch.nn.Module, train_ids: torch.Tensor, eval_batches: torch.Tensor, cfg: Training) -> dict:
    """Train ``model`` in place; return the loss history."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.peak_lr,
        betas=(0.9, 0.95),
    )
    history: dict[str, list] = {"train": [], "held_out": []}
    model.train()
    window_sum, window_n = 0.0, 0
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        starts = torch.randint(0, len(train_ids) - cfg.seq_len, (cfg.batch_size,), generator=gen)
        batch = windows(train_ids, starts, cfg.seq_len)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window_sum, window_n = window_sum + loss.item(), window_n + 1
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            history["train"].append([step + 1, round(window_sum / window_n, 4)])
            window_sum, window_n = 0.0, 0
            held = ""
            if (step + 1) % (cfg.log_every * 5) == 0 or step + 1 == cfg.steps:
                history["held_out"].append([step + 1, round(mean_loss(model, eval_batches), 4)])
                held = f", held-out {history['held_out'][-1][1]:.3f}"
            LOG.info("step %d/%d: train loss %.3f%s (%.0f s)", step + 1, cfg.steps, history["train"][-1][1], held,
                     time.perf_counter() - t0)  # fmt: skip
    model.eval()
    return history


def quantized_copy(model: torch.nn.Module, spec: make_models.ModelSpec = MODEL) -> torch.nn.Module:
    """A copy of ``model`` with every Linear weight replaced by what llmexport stores for it (``spec``'s
    quantization: int4 block 64, asymmetric, dequantized): the exported model's arithmetic in float."""
    import copy

    quant = copy.deepcopy(model)
    make_models.quant_dequant_linears(quant, spec.quant_bit, spec.quant_block, spec.symmetric)
    return quant


def greedy_text(model: torch.nn.Module, tokenizer: Tokenizer, prompt: str, n: int) -> str:
    import torch

    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return tokenizer.decode(ids)


# ---- the model dir -----------------------------------------------------------------------------------------


def spec_prompt(name: str = MODEL.name) -> str:
    """The prompt of the model's spec (``models/<name>.toml``): verify's generation starts from it."""
    from mnnbuild.model.spec import load_spec

    return load_spec(make_models.REPO_ROOT / "models" / f"{name}.toml").verify.prompt


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions() -> dict[str, str]:
    from importlib.metadata import version

    found = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "tokenizers", "llmexport", "MNN", "numpy", "safetensors"):
        found[dist] = version(dist)
    return found


def readme(record: dict) -> str:
    m, t, r = record["model"], record["training"], record["results"]
    return f"""# tiny-qwen3-trained

A small Qwen3 (`Qwen3ForCausalLM`) **trained** here on the CPU and exported to an MNN LLM dir by PyPI
`llmexport` {record["versions"]["llmexport"]}: the model mnnbuild judges *accuracy* on. The random-weight
`tiny-qwen3` computes nothing (its greedy tokens repeat one id; near-ties decide its top-1 picks); this one has
trained weight and activation distributions and generates text, so verify's generation check compares real
words and a quantization error is measured where it matters.

- Trained on torch {TORCH_VERSION}'s own documentation, which ships with the `export` extra's pinned torch: the
  docstrings of the `add_docstr` targets of `torch/_torch_docs.py`, the `torch.nn` modules, the functions of
  `torch.nn.functional`, `torch.linalg`, `torch.fft`, `torch.special` and the `torch.optim` optimizers, with
  reST markup, formulas and code examples removed ({r["documents"]} documents, {r["corpus_chars"]} characters;
  raw docstrings sha256 `{CORPUS_SHA256[:16]}…`, which the script checks). Every {t["held_out_every"]}th
  document is held out of training.
- Tokenizer: byte-level BPE trained on the training documents, vocab {m["vocab_size"]} incl.
  `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (`tokenizer.mtok`, written by llmexport).
- hidden {m["hidden_size"]}, {m["num_layers"]} layers, {m["num_heads"]} attention heads / {m["num_kv_heads"]} KV
  heads, head_dim {m["head_dim"]}, intermediate {m["intermediate_size"]}, q/k norm, RoPE theta 1e6, tied
  embeddings; {r["parameters"]} parameters.
- Training: {t["steps"]} steps of {t["batch_size"]} x {t["seq_len"]} tokens ({r["tokens_seen"]} tokens,
  {r["epochs"]:.1f} passes over the {r["train_tokens"]} training tokens), AdamW, lr {t["peak_lr"]} with
  {t["warmup_steps"]} warmup steps and a cosine down to {t["min_lr"]}, seed {t["seed"]}, {t["threads"]} CPU
  thread: {r["train_seconds"]:.0f} s wall, {r["train_cpu_seconds"]:.0f} s of CPU (a 2-core box shared with other
  jobs).
- Loss (nats per token; uniform over the vocabulary would be {r["uniform_loss"]:.2f}): training
  {r["train_loss"]:.3f} (last {t["log_every"]} steps), held-out {r["held_out_loss"]:.3f} in float32,
  {r["held_out_loss_int4"]:.3f} with the weights llmexport stores (int4, block 64, asymmetric).
- Greedy, 16 tokens from the spec's prompt `{r["prompt"]}` (HF, float32): `{json.dumps(r["sample"])}`
- Weights: int4, block 64, asymmetric (llmexport's default); the tied lm_head doubles as the embedding table.
- Files: `config.json`, `llm_config.json`, `llm.mnn`, `llm.mnn.weight`, `tokenizer.mtok`; `{TRAINING_FILE}` (the
  settings, loss history, versions and the sha256 of each model file); `{WORDS_FILE}` (every word of the
  training text, lower-cased, one a line: the tests check generated text against it).

For accuracy checks; it is not a useful language model. Made by `models/export/train_model.py` (needs the
`export` extra; never in CI); two runs give byte-identical model files (see `models/export/README.md`).
"""


def write_record_files(
    out_dir: Path, record: dict, words: Sequence[str], render: Callable[[dict], str] | None = None
) -> None:
    """``training.json`` (``record`` + the sha256 of each model file), ``corpus-words.txt`` and the README
    (``render(record)``, by default this model's)."""
    record = dict(record, files={n: sha256_file(out_dir / n) for n in make_models.KEEP_FILES if (out_dir / n).exists()})
    (out_dir / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (out_dir / WORDS_FILE).write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    (out_dir / README_FILE).write_text((render or readme)(record), encoding="utf-8")


@dataclass
class TrainedTarget:
    """A target trained by :func:`train_target` and what the record needs of the run."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    docs: list[str]
    train_docs: list[str]
    held_docs: list[str]
    vocab: int
    params: int
    train_ids: torch.Tensor
    history: dict
    seconds: float
    cpu_seconds: float
    held_fp32: float
    held_quant: float


def set_determinism(seed: int, threads: int) -> None:
    """Seeded, deterministic kernels, ``threads`` intra- and inter-op threads (set once per process)."""
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        torch.set_num_interop_threads(threads)


def train_target(cfg: Training, spec: make_models.ModelSpec, hf_dir: Path) -> TrainedTarget:
    """Train ``spec`` on torch's documentation (:func:`checked_documents`) with its own BPE tokenizer; save the HF
    model and tokenizer into ``hf_dir``."""
    import torch

    docs = [d for d in (clean_document(raw) for raw in checked_documents()) if d]
    train_docs, held_docs = split_documents(docs, cfg.held_out_every)
    LOG.info("corpus: %d documents (%d held out), %d characters", len(docs), len(held_docs), sum(map(len, docs)))
    tokenizer = make_models.bpe_tokenizer(train_docs, cfg.vocab_size)
    vocab = make_models.save_tokenizer(tokenizer, hf_dir)
    train_ids, held_ids = token_stream(tokenizer, train_docs), token_stream(tokenizer, held_docs)
    eval_gen = torch.Generator().manual_seed(cfg.seed + 1)
    eval_starts = torch.randint(0, len(held_ids) - cfg.seq_len, (cfg.eval_windows,), generator=eval_gen)
    eval_batches = windows(held_ids, eval_starts, cfg.seq_len)

    config, model_cls = make_models.hf_config(spec, vocab)
    torch.manual_seed(cfg.seed)
    model = model_cls(config).to(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    LOG.info("%s: %d parameters, %d training tokens", spec.name, params, len(train_ids))
    t0, cpu0 = time.perf_counter(), time.process_time()
    history = train(model, train_ids, eval_batches, cfg)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    model.save_pretrained(hf_dir, safe_serialization=True)
    LOG.info("hf weights sha256 %s", sha256_file(hf_dir / "model.safetensors"))
    held_fp32 = mean_loss(model, eval_batches)
    held_quant = mean_loss(quantized_copy(model, spec), eval_batches)
    return TrainedTarget(
        model, tokenizer, docs, train_docs, held_docs, vocab, params, train_ids, history, seconds, cpu_seconds,
        held_fp32, held_quant,
    )  # fmt: skip


def target_record(cfg: Training, spec: make_models.ModelSpec, run: TrainedTarget) -> dict:
    """The corpus, model, training and results part of ``training.json`` for a target trained by
    :func:`train_target`."""
    return {
        "what": spec.purpose,
        "corpus": {
            "source": f"torch {TORCH_VERSION}'s docstrings (train_model.raw_documents)",
            "raw_sha256": CORPUS_SHA256,
        },
        "model": {
            **{k: v for k, v in asdict(spec).items() if k not in ("dest", "vision", "mrope_section")},
            "vocab_size": run.vocab,
        },  # fmt: skip
        "training": asdict(cfg),
        "results": {
            "documents": len(run.docs),
            "corpus_chars": sum(map(len, run.docs)),
            "parameters": run.params,
            "train_tokens": len(run.train_ids),
            "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
            "epochs": cfg.steps * cfg.batch_size * cfg.seq_len / len(run.train_ids),
            "train_seconds": round(run.seconds, 1),
            "train_cpu_seconds": round(run.cpu_seconds, 1),
            "uniform_loss": round(math.log(run.vocab), 4),
            "train_loss": run.history["train"][-1][1],
            "held_out_loss": round(run.held_fp32, 4),
            "held_out_loss_int4": round(run.held_quant, 4),
        },
        "history": run.history,
        "versions": versions(),
    }


def build(cfg: Training, dest: Path, keep_tmp: bool, verify: bool) -> None:
    set_determinism(cfg.seed, cfg.threads)
    work = Path(tempfile.mkdtemp(prefix=f"mnnbuild-{MODEL.name}-"))
    try:
        hf_dir = work / "hf"
        hf_dir.mkdir()
        run = train_target(cfg, MODEL, hf_dir)
        prompt = spec_prompt()
        sample = greedy_text(run.model, run.tokenizer, prompt, 16)
        LOG.info("held-out loss %.4f (float32), %.4f (llmexport int4); greedy: %r", run.held_fp32, run.held_quant,
                 sample)  # fmt: skip

        out_dir = make_models.export_hf_model(MODEL, cfg.seed, hf_dir, work, verify)
        record = target_record(cfg, MODEL, run)
        record["results"].update(prompt=prompt, sample=sample)
        write_record_files(out_dir, record, corpus_words(run.train_docs))
        make_models.publish_outputs(out_dir, dest, extra=(TRAINING_FILE, WORDS_FILE, README_FILE))
        LOG.info("%s -> %s", MODEL.name, dest)
    finally:
        if keep_tmp:
            LOG.info("kept temporary dir %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=make_models.REPO_ROOT / MODEL.dest, help="model dir to write")
    parser.add_argument("--steps", type=int, default=Training.steps, help="training steps")
    parser.add_argument("--threads", type=int, default=Training.threads, help="torch CPU threads (intra and inter op)")
    args = make_models.parse_export_args(parser, argv)
    cfg = Training(steps=args.steps, threads=args.threads)
    build(cfg, args.out.resolve(), args.keep_tmp, not args.no_verify)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
