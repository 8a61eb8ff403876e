#!/usr/bin/env python3
"""Train a tiny Qwen3 target and an Eagle3 draft for it here, on the CPU, and export the pair with PyPI
``llmexport --eagle_path`` into ``models/tiny-qwen3-eagle``.

The target is trained as ``train_model.py`` trains ``tiny-qwen3-trained`` (same corpus, tokenizer recipe,
schedule and export), with 8 layers instead of 4: an Eagle3 draft reads the inputs of the target's blocks
``L-3``, ``L//2`` and ``2`` (llmexport's ``utils/model.py``), three distinct taps only from 7 layers up.

The draft is self-distilled: it learns to predict the target's own greedy next token from the target's own tapped
hidden states, on sequences the target generated greedily from prefixes of its training documents (the text the
draft meets when the engine speculates). Everything is computed with the weights the export stores (int4, block 64,
asymmetric, dequantized), so the labels are the tokens MNN's CPU engine decodes. Training unrolls the draft on its
own outputs for the engine's draft depth (Eagle3's training-time test): step ``k`` feeds the draft's step ``k-1``
output hidden state back with the next token, attends to the real positions' keys and to its own earlier steps'
keys, at position ``anchor + k``, exactly as ``speculative_decoding/eagle.cpp`` drafts a chain.

What llmexport 0.0.5 builds from the draft folder (``utils/eagle.py``) fixes the draft's architecture: one decoder
layer whose attention has the target's heads / KV heads / head_dim, no q/k norm, and RoPE with theta 10000 whatever
the draft's config says; ``q/k/v_proj`` read ``[input_layernorm(embedding), hidden_norm(hidden)]`` (2 x hidden);
the residual is the hidden input; ``fc`` maps the three taps (3 x hidden) to hidden; ``lm_head`` covers
``draft_vocab_size`` tokens, which ``d2t`` maps to target ids (``target = draft + d2t[draft]``). The draft here
is written to match that, so the exported ``eagle.mnn`` computes what was trained.

``--random DIR`` instead writes a random-weight pair (7 layers, hidden 128, vocab 1024: make_models' tiny-model
recipe) through the same export, for build plumbing only (its draft accepts almost nothing).

Deterministic (seeds, ``torch.use_deterministic_algorithms``, pinned threads). Maintenance only (``pip install -e
'.[export]'`` with torch 2.13.0, the corpus' version): never run by CI or tests.

    python models/export/train_eagle.py [--out DIR] [--steps N] [--draft-steps N] [--draft-sequences N]
                                        [--ttt-depth N] [--threads N] [--no-verify] [--keep-tmp] [-v]
    python models/export/train_eagle.py --random DIR
    python models/export/train_eagle.py --random DIR --qwen3-1.7b-layers 28 --no-verify   # real-size, random
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCRIPT_DIR = Path(__file__).resolve().parent
if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))

import make_models  # noqa: E402  (tokenizer, HF config, llmexport, checks)
import train_model  # noqa: E402  (corpus, target training, records)

LOG = logging.getLogger("train_eagle")

TARGET = dataclasses.replace(
    train_model.MODEL,
    name="tiny-qwen3-eagle",
    dest="models/tiny-qwen3-eagle",
    num_layers=8,
    purpose="trained Qwen3 target + self-distilled Eagle3 draft, to measure speculative decoding (int4 block 64 asym)",
)
RANDOM_TARGET = dataclasses.replace(
    make_models.MODELS[0],
    name="tiny-eagle-random",
    dest="",
    num_layers=7,
    purpose="random-weight Qwen3 target + random Eagle3 draft: build plumbing only",
)
DRAFT_DIR = "eagle-draft"
"""The draft checkpoint folder (``config.json`` + ``model.safetensors``) kept in the work dir for llmexport."""
LLMEXPORT_DRAFT_ROPE_THETA = 10000.0
"""llmexport 0.0.5's ``Eagle`` builds its rotary from a fixed ``rope_theta = 10000`` (not the target's 1e6, not the
draft config's): the draft is trained with it."""
ENGINE_DRAFTS = 3
"""Tokens MNN's engine drafts per target forward by default: a chain (``eagle_topk`` 1) of ``eagle_depth`` 3,
``draft_predict_length`` 3."""


@dataclass(frozen=True)
class DraftSpec:
    """The Eagle3 draft's own sizes (heads and head_dim are the target's: llmexport takes them from it)."""

    intermediate_size: int = 384
    draft_vocab_size: int = 1024
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"


@dataclass(frozen=True)
class DraftTraining:
    """How the draft is trained (recorded in ``training.json``)."""

    seed: int = 20251206
    sequences: int = 2048
    """Greedy generations of the target used as training text."""
    prompt_min: int = 4
    prompt_max: int = 48
    """Each generation starts from a training-text window of this many tokens (uniform)..."""
    seq_len: int = 128
    """... and is continued by the target to this many tokens."""
    gen_batch: int = 64
    steps: int = 1500
    batch_size: int = 16
    ttt_depth: int = 3
    """Draft steps unrolled per anchor: the engine's default ``eagle_depth`` (3 chained draft forwards)."""
    step_weight: float = 0.8
    """Loss weight of unrolled step k: step_weight ** k (Eagle3's)."""
    peak_lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    log_every: int = 100
    eval_prompts: int = 8
    """Held-out documents whose first words are the acceptance prompts."""
    prompt_words: int = 6
    eval_new_tokens: int = 64
    threads: int = 1


# ---- the draft ---------------------------------------------------------------------------------------------


def eagle_taps(num_layers: int) -> list[int]:
    """The blocks whose inputs llmexport concatenates into the target's ``hidden_states`` output, in that order."""
    taps = sorted({num_layers - 3, num_layers // 2, 2})
    if len(taps) != 3:
        raise SystemExit(f"an Eagle3 target needs at least 7 layers for three distinct taps, not {num_layers}")
    return taps


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama RoPE (rotate-half) of ``x`` [batch, heads, seq, head_dim] at ``positions`` [seq]."""
    import torch

    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angle = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    return x * cos + rotate_half(x) * sin


def build_draft(target: make_models.ModelSpec, draft: DraftSpec) -> torch.nn.Module:
    """An Eagle3 draft module whose ``state_dict`` keys are llmexport's (``fc``, ``midlayer.*``, ``norm``,
    ``lm_head``, ``d2t``)."""
    import torch
    from torch import nn

    hidden, heads, kv_heads, head_dim = target.hidden_size, target.num_heads, target.num_kv_heads, target.head_dim

    class Draft(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3 * hidden, hidden, bias=False)
            self.midlayer = nn.Module()
            mid = self.midlayer
            mid.hidden_norm = nn.RMSNorm(hidden, eps=draft.rms_norm_eps)
            mid.input_layernorm = nn.RMSNorm(hidden, eps=draft.rms_norm_eps)
            mid.self_attn = nn.Module()
            mid.self_attn.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
            mid.self_attn.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
            mid.self_attn.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
            mid.self_attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
            mid.post_attention_layernorm = nn.RMSNorm(hidden, eps=draft.rms_norm_eps)
            mid.mlp = nn.Module()
            mid.mlp.gate_proj = nn.Linear(hidden, draft.intermediate_size, bias=False)
            mid.mlp.up_proj = nn.Linear(hidden, draft.intermediate_size, bias=False)
            mid.mlp.down_proj = nn.Linear(draft.intermediate_size, hidden, bias=False)
            self.norm = nn.RMSNorm(hidden, eps=draft.rms_norm_eps)
            self.lm_head = nn.Linear(hidden, draft.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(draft.draft_vocab_size, dtype=torch.int64))

        def step(
            self,
            embeds: torch.Tensor,
            hidden: torch.Tensor,
            positions: torch.Tensor,
            past: list[tuple[torch.Tensor, torch.Tensor]],
        ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            """One draft forward for every anchor at once: ``embeds``/``hidden`` [batch, anchors, hidden] at
            ``positions`` [anchors]. ``past`` holds the (keys, values) of the earlier unrolled steps: the first is
            the real positions' (attended causally), the later ones each anchor's own chain (attended one to one).
            Returns the output hidden state (pre-norm) and this step's (keys, values)."""
            mid, attn = self.midlayer, self.midlayer.self_attn
            batch, anchors, _ = embeds.shape
            x = torch.cat((mid.input_layernorm(embeds), mid.hidden_norm(hidden)), dim=-1)

            def heads_of(t: torch.Tensor, n: int) -> torch.Tensor:
                return t.view(batch, anchors, n, head_dim).transpose(1, 2)

            q = rope(heads_of(attn.q_proj(x), heads), positions, LLMEXPORT_DRAFT_ROPE_THETA)
            k = rope(heads_of(attn.k_proj(x), kv_heads), positions, LLMEXPORT_DRAFT_ROPE_THETA)
            v = heads_of(attn.v_proj(x), kv_heads)
            group = heads // kv_heads
            steps = [*past, (k, v)]
            keys = [kk.repeat_interleave(group, dim=1) for kk, _ in steps]
            values = [vv.repeat_interleave(group, dim=1) for _, vv in steps]
            scale = 1.0 / math.sqrt(head_dim)
            causal = torch.full((anchors, anchors), float("-inf")).triu(1)
            scores = [q @ keys[0].transpose(-1, -2) * scale + causal]
            scores += [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]
            probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
            out = probs[..., :anchors] @ values[0]
            for j, vv in enumerate(values[1:]):
                out = out + probs[..., anchors + j : anchors + j + 1] * vv
            out = out.transpose(1, 2).reshape(batch, anchors, heads * head_dim)
            h = hidden + attn.o_proj(out)
            mlp = mid.mlp
            post = mid.post_attention_layernorm(h)
            h = h + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(post)) * mlp.up_proj(post))
            return h, (k, v)

        def logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.norm(hidden_out))

    if draft.hidden_act != "silu":
        raise SystemExit(f"draft hidden_act {draft.hidden_act!r}: only silu is built here")
    return Draft()


def draft_config(target: make_models.ModelSpec, vocab: int, draft: DraftSpec) -> dict:
    """The draft folder's ``config.json``: what llmexport's ``Eagle`` reads (``hidden_size`` = the target's,
    ``vocab_size``, ``draft_vocab_size``, ``intermediate_size``, ``rms_norm_eps``, ``hidden_act``), plus the
    attention shape it takes from the target and the RoPE theta it uses, for the record."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": draft.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "hidden_act": draft.hidden_act,
        "rms_norm_eps": draft.rms_norm_eps,
        "rope_theta": LLMEXPORT_DRAFT_ROPE_THETA,
        "vocab_size": vocab,
        "draft_vocab_size": draft.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def save_draft(module: torch.nn.Module, config: dict, out_dir: Path) -> None:
    """Write the draft folder llmexport's ``--eagle_path`` reads."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tensors = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def quantized_draft(module: torch.nn.Module, spec: make_models.ModelSpec) -> torch.nn.Module:
    """A copy of the draft with the weights MNNConvert stores for ``eagle.mnn`` / ``eagle_fc.mnn`` (llmexport
    converts them with the target's ``--quant_bit`` / ``--quant_block``), dequantized."""
    import copy

    quant = copy.deepcopy(module)
    make_models.quant_dequant_linears(quant, spec.quant_bit, spec.quant_block, spec.symmetric, by_mnnconvert=True)
    return quant


# ---- the target's features ---------------------------------------------------------------------------------


def target_features(model: torch.nn.Module, ids: torch.Tensor, taps: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The target's tapped block inputs concatenated ([batch, seq, 3 x hidden], llmexport's ``hidden_states``
    output) and its greedy next token at each position ([batch, seq])."""
    import torch

    captured: dict[int, torch.Tensor] = {}
    layers = model.model.layers
    hooks = [
        layers[i].register_forward_pre_hook(lambda _m, args, kwargs, i=i: captured.__setitem__(i, args[0] if args
                                            else kwargs["hidden_states"]), with_kwargs=True)
        for i in taps
    ]  # fmt: skip
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[i] for i in taps], dim=-1), logits.argmax(-1)


def greedy_generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``prompts`` [batch, p] followed by the target's ``new_tokens`` greedy tokens (KV cache, no stopping)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        seq = [prompts, out.logits[:, -1:].argmax(-1)]
        for _ in range(new_tokens - 1):
            out = model(input_ids=seq[-1], past_key_values=out.past_key_values, use_cache=True)
            seq.append(out.logits[:, -1:].argmax(-1))
    return torch.cat(seq, dim=1)


# ---- draft training ----------------------------------------------------------------------------------------


@dataclass
class TrainingText:
    """The draft's training text with the target's features, computed once: ``ids`` [n, seq], ``feats``
    [n, seq, 3 x hidden] (the taps), ``greedy`` [n, seq] (the target's next token at each position)."""

    ids: torch.Tensor
    feats: torch.Tensor
    greedy: torch.Tensor


def generate_training_text(
    target: torch.nn.Module, train_ids: torch.Tensor, taps: Sequence[int], cfg: DraftTraining
) -> TrainingText:
    """Windows of the training text continued greedily by the target to ``cfg.seq_len`` tokens, with the target's
    features."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    ids, feats, greedy = [], [], []
    for _ in range(cfg.sequences // cfg.gen_batch):
        p = int(torch.randint(cfg.prompt_min, cfg.prompt_max + 1, (1,), generator=gen))
        starts = torch.randint(0, len(train_ids) - p, (cfg.gen_batch,), generator=gen)
        batch = greedy_generate(target, train_model.windows(train_ids, starts, p), cfg.seq_len - p)
        batch_feats, batch_greedy = target_features(target, batch, taps)
        ids.append(batch)
        feats.append(batch_feats)
        greedy.append(batch_greedy)
    return TrainingText(torch.cat(ids), torch.cat(feats), torch.cat(greedy))


def choose_draft_vocab(text: TrainingText, size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The ``size`` target ids the target predicts most often on the training text (ascending), and the share of
    its predictions they cover."""
    import torch

    counts = torch.bincount(text.greedy.flatten(), minlength=vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))
    chosen = torch.tensor(sorted(order[:size]), dtype=torch.int64)
    return chosen, float(counts[chosen].sum()) / float(counts.sum())


def unroll(
    draft: torch.nn.Module,
    embed: torch.Tensor,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    depth: int,
    feed: Callable[[int, torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """The draft's logits at each of ``depth`` unrolled steps for every anchor at once, as the engine drafts a
    chain from one anchor.

    Anchor ``t`` at step 0 reads ``tokens[:, t]`` (the token after ``t``) and ``hidden[:, t]`` (``fc`` of the
    target's taps at ``t``); at step ``k`` it reads ``feed(k - 1, logits of step k - 1)[:, t]`` and the draft's
    own step ``k - 1`` output hidden state, at position ``t + k``, attending to the real anchors' keys up to ``t``
    (step 0's, causally) and to its own earlier steps' keys."""
    import torch

    positions = torch.arange(tokens.shape[1])
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    logits = []
    for k in range(depth):
        if k:
            tokens = feed(k - 1, logits[-1])
        hidden, kv = draft.step(embed[tokens], hidden, positions + k, past)
        past.append(kv)
        logits.append(draft.logits(hidden))
    return logits


def unrolled_loss(
    draft: torch.nn.Module,
    embed: torch.Tensor,
    ids: torch.Tensor,
    taps: torch.Tensor,
    greedy: torch.Tensor,
    t2d: torch.Tensor,
    cfg: DraftTraining,
) -> tuple[torch.Tensor, list[float]]:
    """The draft's loss over the anchors of ``ids`` [batch, seq] unrolled ``cfg.ttt_depth`` steps (:func:`unroll`,
    fed the text's own next tokens), and its top-1 accuracy per step.

    Step ``k`` of anchor ``t`` is labelled with the target's greedy token after position ``t + k + 1``; it counts
    only where the tokens fed before it are the target's greedy ones (what the engine feeds when the earlier
    drafts were right) and its label is in the draft vocabulary."""
    import torch

    depth = cfg.ttt_depth
    anchors = ids.shape[1] - depth
    logits = unroll(
        draft, embed, ids[:, 1 : 1 + anchors], draft.fc(taps[:, :anchors]), depth,
        lambda k, _logits: ids[:, k + 2 : k + 2 + anchors],
    )  # fmt: skip
    consistent = torch.ones(ids.shape[0], anchors, dtype=torch.bool)
    total = torch.zeros(())
    accuracy = []
    for k, step_logits in enumerate(logits):
        if k:
            consistent = consistent & (ids[:, k + 1 : k + 1 + anchors] == greedy[:, k : k + anchors])
        labels = t2d[greedy[:, k + 1 : k + 1 + anchors]]
        valid = consistent & (labels >= 0)
        ce = torch.nn.functional.cross_entropy(
            step_logits.flatten(0, 1), labels.clamp_min(0).flatten(), reduction="none"
        )
        n = valid.sum().clamp_min(1)
        total = total + cfg.step_weight**k * (ce * valid.flatten()).sum() / n
        accuracy.append(float(((step_logits.argmax(-1) == labels) & valid).sum() / n))
    return total, accuracy


def train_draft(
    draft: torch.nn.Module, embed: torch.Tensor, text: TrainingText, t2d: torch.Tensor, cfg: DraftTraining
) -> dict:
    """Train ``draft`` in place on the target's generations; return the loss/accuracy history."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    decay = [p for p in draft.parameters() if p.ndim >= 2]
    no_decay = [p for p in draft.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.peak_lr,
        betas=(0.9, 0.95),
    )
    history: dict[str, list] = {"train": []}
    window_loss, window_acc, window_n = 0.0, [0.0] * cfg.ttt_depth, 0
    draft.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = train_model.learning_rate(step, cfg)  # type: ignore[arg-type]  # same schedule fields
        rows = torch.randint(0, len(text.ids), (cfg.batch_size,), generator=gen)
        loss, acc = unrolled_loss(draft, embed, text.ids[rows], text.feats[rows], text.greedy[rows], t2d, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        opt.step()
        window_loss, window_n = window_loss + loss.item(), window_n + 1
        window_acc = [a + b for a, b in zip(window_acc, acc, strict=True)]
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            accs = [round(a / window_n, 4) for a in window_acc]
            history["train"].append([step + 1, round(window_loss / window_n, 4), accs])
            LOG.info("draft step %d/%d: loss %.3f, top-1 per unrolled step %s (%.0f s)", step + 1, cfg.steps,
                     window_loss / window_n, accs, time.perf_counter() - t0)  # fmt: skip
            window_loss, window_acc, window_n = 0.0, [0.0] * cfg.ttt_depth, 0
    draft.eval()
    return history


# ---- acceptance, simulated as MNN's engine drafts -----------------------------------------------------------


def simulate_eagle(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompt: list[int],
    new_tokens: int,
    taps: Sequence[int],
    depth: int,
) -> dict:
    """Greedy generation with a chain draft of ``depth`` tokens (the engine's defaults: ``eagle_topk`` 1,
    ``eagle_depth`` = ``draft_predict_length`` = 3), in torch: the plain greedy tokens and the tokens accepted by
    each target forward after the prefill (matching drafts + the target's own next token)."""
    import torch

    embed = target.get_input_embeddings().weight.detach()
    full = greedy_generate(target, torch.tensor([prompt]), new_tokens + depth + 1)
    feats, _ = target_features(target, full, taps)
    anchors = full.shape[1] - 1
    with torch.no_grad():
        logits = unroll(
            draft, embed, full[:, 1:], draft.fc(feats[:, :anchors]), depth,
            lambda _k, step_logits: to_target(draft, step_logits.argmax(-1)),
        )  # fmt: skip
    drafts = torch.stack([to_target(draft, step.argmax(-1))[0] for step in logits], dim=-1).tolist()  # [anchor][k]
    seq = full[0].tolist()
    anchor, accepted = len(prompt) - 1, []
    while sum(accepted) < new_tokens:  # the engine's stop: tokens after the prefill's
        # the engine drafts from the last known token (seq[anchor + 1]); the target checks the chain in one forward
        matched = 0
        while matched < depth and drafts[anchor][matched] == seq[anchor + 2 + matched]:
            matched += 1
        accepted.append(matched + 1)
        anchor += matched + 1
    return {"tokens": seq[len(prompt) : anchor + 2], "accepted": accepted}


def to_target(draft: torch.nn.Module, index: torch.Tensor) -> torch.Tensor:
    """Target token ids of draft vocabulary indices (``d2t`` holds the offsets, as the engine reads it)."""
    return index + draft.d2t[index]


# ---- the pairs ---------------------------------------------------------------------------------------------


def init_draft(draft: torch.nn.Module, seed: int) -> None:
    """HF-style init (normal, std 0.02); norm weights 1."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)


def set_draft_vocab(draft: torch.nn.Module, chosen: torch.Tensor) -> None:
    """Make draft index ``i`` stand for target id ``chosen[i]`` (``d2t`` = the offset, as Eagle3 stores it)."""
    import torch

    draft.d2t.copy_(chosen - torch.arange(len(chosen)))


def check_draft_export(
    draft: torch.nn.Module, spec: make_models.ModelSpec, out_dir: Path, strict: bool = True
) -> float:
    """``eagle_d2t.mnn`` holds the draft's ``d2t``; ``eagle_fc.mnn`` computes the draft's ``fc`` with the weights
    MNNConvert stores (its max abs difference is returned; not ``strict``: logged, not enforced)."""
    import MNN.expr as F
    import numpy as np
    import torch

    # keep the loaded list alive while reading: a var read after its list is freed gives garbage now and then
    loaded = F.load_as_list(str(out_dir / "eagle_d2t.mnn"))
    d2t = np.array(loaded[0].read(), dtype=np.int64).reshape(-1)
    want_d2t = draft.d2t.numpy()
    if not np.array_equal(d2t, want_d2t):
        bad = np.flatnonzero(d2t != want_d2t) if d2t.shape == want_d2t.shape else []
        raise SystemExit(
            f"{spec.name}: eagle_d2t.mnn {d2t.shape} differs from the draft's d2t {want_d2t.shape} at {len(bad)} "
            f"indices (first {list(bad[:5])}: {d2t[bad[:5]]} vs {want_d2t[bad[:5]]})"
        )
    from check_models import load_module

    module, info = load_module(out_dir, "eagle_fc.mnn", "eagle_fc.mnn.weight")
    x = np.random.default_rng(0).standard_normal((1, 5, 3 * spec.hidden_size)).astype(np.float32)
    (out,) = module.forward([F.const(x, list(x.shape), F.NCHW, F.float)])
    got = np.array(out.read(), dtype=np.float32).reshape(5, spec.hidden_size)
    with torch.no_grad():
        want = quantized_draft(draft, spec).fc(torch.from_numpy(x))[0].numpy()
    diff = float(np.abs(got - want).max())
    LOG.info("%s: eagle_fc.mnn vs the draft's fc (MNNConvert int4 dequantized): max abs diff %.3g", spec.name, diff)
    if diff > 1e-3 and not strict:  # the real-size random draft: 0.019 at 6144 -> 2048 (cause not found)
        LOG.warning("%s: eagle_fc.mnn differs from the draft's fc by %.3g (> 1e-3; not enforced)", spec.name, diff)
    elif diff > 1e-3:
        raise SystemExit(f"{spec.name}: eagle_fc.mnn differs from the draft's fc by {diff}")
    return diff


QWEN3_1_7B_DRAFT = DraftSpec(intermediate_size=6144, draft_vocab_size=32000)
"""Qwen3-1.7B-Eagle3's draft sizes (hidden 2048 is the target's): the real-size benchmark's random draft."""


def build_random(dest: Path, seed: int, keep_tmp: bool, verify: bool, layers: int | None = None) -> None:
    """A random-weight pair (make_models' tiny recipe, 7 layers; random draft, draft vocab = the even target ids);
    with ``layers``, make_models' Qwen3-1.7B-shaped target of that many layers and a draft of Qwen3-1.7B-Eagle3's
    sizes (:data:`QWEN3_1_7B_DRAFT`), for the real-size benchmark."""
    import torch

    train_model.set_determinism(seed, 1)
    if layers is None:
        spec = RANDOM_TARGET
        draft_spec = DraftSpec(intermediate_size=spec.intermediate_size, draft_vocab_size=512)
    else:
        spec, draft_spec = make_models.qwen3_1_7b_spec(layers), QWEN3_1_7B_DRAFT
    eagle_taps(spec.num_layers)  # fewer than 7 layers: one line, before minutes of export
    work = Path(tempfile.mkdtemp(prefix=f"mnnbuild-{spec.name}-"))
    try:
        hf_dir = work / "hf"
        hf_dir.mkdir()
        tokens = make_models.save_tokenizer(make_models.train_tokenizer(make_models.DEFAULT_SEED, 1024), hf_dir)
        vocab = max(tokens, spec.vocab_size or 0)  # real size: Qwen3's 151936 rows over the 1024-token tokenizer
        make_models.build_hf_model(spec, seed, vocab, hf_dir)
        draft = build_draft(spec, draft_spec)
        init_draft(draft, seed)
        with torch.no_grad():  # like make_models' models: a dropped norm weight shows
            for name, param in draft.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(torch.randn_like(param) * 0.1)
        set_draft_vocab(draft, torch.arange(0, 2 * draft_spec.draft_vocab_size, 2))
        save_draft(draft, draft_config(spec, vocab, draft_spec), work / DRAFT_DIR)
        out_dir = make_models.export_hf_model(spec, seed, hf_dir, work, verify, eagle_dir=work / DRAFT_DIR)
        check_draft_export(draft, spec, out_dir, strict=layers is None)
        make_models.publish_outputs(out_dir, dest)
        LOG.info("%s -> %s", spec.name, dest)
    finally:
        if keep_tmp:
            LOG.info("kept temporary dir %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def held_prompts(held_docs: Sequence[str], cfg: DraftTraining) -> list[str]:
    """The acceptance prompts: the first words of the first held-out documents (never trained on)."""
    return [" ".join(doc.split()[: cfg.prompt_words]) for doc in held_docs[: cfg.eval_prompts]]


def simulated_acceptance(
    target: torch.nn.Module, draft: torch.nn.Module, tokenizer: object, prompts: Sequence[str], cfg: DraftTraining,
    taps: Sequence[int],
) -> dict:  # fmt: skip
    """:func:`simulate_eagle` over ``prompts``: accepted tokens per target forward, overall and per prompt."""
    per_prompt, decoded, forwards = [], 0, 0
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids  # type: ignore[attr-defined]
        sim = simulate_eagle(target, draft, ids, cfg.eval_new_tokens, taps, ENGINE_DRAFTS)
        decoded, forwards = decoded + sum(sim["accepted"]), forwards + len(sim["accepted"])
        per_prompt.append(round(sum(sim["accepted"]) / len(sim["accepted"]), 4))
    return {"accepted_per_forward": round(decoded / forwards, 4), "per_prompt": per_prompt, "forwards": forwards}


def mnn_acceptance(out_dir: Path, prompts: Sequence[str], new_tokens: int, depth: int) -> dict:
    """The exported pair in MNN's own engine (check_eagle.py, full precision): tokens identical to plain greedy
    decoding, and the accepted tokens per target forward."""
    import check_eagle

    rows = [check_eagle.run_prompt(out_dir, p, "normal", new_tokens, depth) for p in prompts]
    decoded, forwards = sum(r["tokens"] - 1 for r in rows), sum(r["target_forwards"] for r in rows)
    return {
        "identical": all(r["identical"] for r in rows),
        "accepted_per_forward": round(decoded / forwards, 4),
        "per_prompt": [r["accepted_per_forward"] for r in rows],
        "forwards": forwards,
    }


def build(cfg: train_model.Training, dcfg: DraftTraining, dspec: DraftSpec, dest: Path, keep_tmp: bool,
          verify: bool) -> None:  # fmt: skip
    import torch

    train_model.set_determinism(cfg.seed, cfg.threads)
    taps = eagle_taps(TARGET.num_layers)
    work = Path(tempfile.mkdtemp(prefix=f"mnnbuild-{TARGET.name}-"))
    try:
        hf_dir = work / "hf"
        hf_dir.mkdir()
        run = train_model.train_target(cfg, TARGET, hf_dir)
        prompt = train_model.spec_prompt(TARGET.name)
        sample = train_model.greedy_text(run.model, run.tokenizer, prompt, 16)
        LOG.info("target held-out loss %.4f (float32), %.4f (int4); greedy: %r", run.held_fp32, run.held_quant,
                 sample)  # fmt: skip

        # the draft learns what MNN runs: the target with the weights llmexport stores
        target = train_model.quantized_copy(run.model, TARGET).eval()
        t0, cpu0 = time.perf_counter(), time.process_time()
        text = generate_training_text(target, run.train_ids, taps, dcfg)
        chosen, coverage = choose_draft_vocab(text, dspec.draft_vocab_size, run.vocab)
        LOG.info("draft vocabulary: %d of %d target ids cover %.4f of the target's predictions", len(chosen),
                 run.vocab, coverage)  # fmt: skip
        t2d = torch.full((run.vocab,), -1, dtype=torch.int64)
        t2d[chosen] = torch.arange(len(chosen))
        draft = build_draft(TARGET, dspec)
        init_draft(draft, dcfg.seed)
        set_draft_vocab(draft, chosen)
        with torch.no_grad():  # start from the target's own output head, restricted to the draft vocabulary
            draft.lm_head.weight.copy_(target.lm_head.weight[chosen])
            draft.norm.weight.copy_(target.model.norm.weight)
        history = train_draft(draft, target.get_input_embeddings().weight.detach(), text, t2d, dcfg)
        draft_seconds, draft_cpu = time.perf_counter() - t0, time.process_time() - cpu0

        prompts = held_prompts(run.held_docs, dcfg)
        sim_float = simulated_acceptance(target, draft, run.tokenizer, prompts, dcfg, taps)
        sim_int4 = simulated_acceptance(target, quantized_draft(draft, TARGET), run.tokenizer, prompts, dcfg, taps)
        LOG.info("simulated acceptance on held-out prompts: %.3f (float draft), %.3f (int4 draft, as exported)",
                 sim_float["accepted_per_forward"], sim_int4["accepted_per_forward"])  # fmt: skip

        config = draft_config(TARGET, run.vocab, dspec)
        save_draft(draft, config, work / DRAFT_DIR)
        out_dir = make_models.export_hf_model(TARGET, cfg.seed, hf_dir, work, verify, eagle_dir=work / DRAFT_DIR)
        fc_diff = check_draft_export(draft, TARGET, out_dir)
        measured = mnn_acceptance(out_dir, prompts, dcfg.eval_new_tokens, ENGINE_DRAFTS)
        LOG.info("MNN.llm (CPU, memory normal): accepted per target forward %.3f, tokens identical: %s",
                 measured["accepted_per_forward"], measured["identical"])  # fmt: skip

        record = train_model.target_record(cfg, TARGET, run)
        record["sizes"] = {n: (out_dir / n).stat().st_size for n in make_models.KEEP_FILES if (out_dir / n).exists()}
        record["results"].update(prompt=prompt, sample=sample, eval_prompts=prompts)
        record["draft"] = {
            "spec": asdict(dspec),
            "config": config,
            "taps": taps,
            "training": asdict(dcfg),
            "results": {
                "parameters": sum(p.numel() for p in draft.parameters()),
                "training_text_tokens": text.ids.numel(),
                "draft_vocab_coverage": round(coverage, 4),
                "train_seconds": round(draft_seconds, 1),
                "train_cpu_seconds": round(draft_cpu, 1),
                "final_loss": history["train"][-1][1],
                "final_top1_per_step": history["train"][-1][2],
                "eagle_fc_max_abs_diff": fc_diff,
                "simulated_float": sim_float,
                "simulated_int4": sim_int4,
                "mnn_llm_cpu": measured,
            },
            "history": history,
        }
        train_model.write_record_files(out_dir, record, train_model.corpus_words(run.train_docs), readme)
        make_models.publish_outputs(
            out_dir, dest, extra=(train_model.TRAINING_FILE, train_model.WORDS_FILE, train_model.README_FILE)
        )
        LOG.info("%s -> %s", TARGET.name, dest)
    finally:
        if keep_tmp:
            LOG.info("kept temporary dir %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def readme(record: dict) -> str:
    m, t, r = record["model"], record["training"], record["results"]
    d, dt, dr = record["draft"]["spec"], record["draft"]["training"], record["draft"]["results"]
    mnn, sim = dr["mnn_llm_cpu"], dr["simulated_int4"]
    sizes = ", ".join(f"`{name}` {size / 1024:.0f} KB" for name, size in record.get("sizes", {}).items())
    return f"""# tiny-qwen3-eagle

A small Qwen3 target **trained** here on the CPU and an **Eagle3 draft self-distilled from it**, exported together
by PyPI `llmexport` {record["versions"]["llmexport"]} `--eagle_path`: the pair mnnbuild measures speculative
decoding with (random drafts accept almost nothing and prove only the plumbing).

Target (as `tiny-qwen3-trained`, with 8 layers instead of 4: Eagle3 reads the inputs of blocks L-3, L//2 and 2, three
distinct taps only from 7 layers):

- Trained on torch {train_model.TORCH_VERSION}'s own documentation (the corpus of `tiny-qwen3-trained`:
  {r["documents"]} documents, {r["corpus_chars"]} characters; every {t["held_out_every"]}th document held out), its
  byte-level BPE tokenizer (vocab {m["vocab_size"]}).
- hidden {m["hidden_size"]}, {m["num_layers"]} layers, {m["num_heads"]} heads / {m["num_kv_heads"]} KV heads,
  head_dim {m["head_dim"]}, intermediate {m["intermediate_size"]}, tied embeddings; {r["parameters"]} parameters.
- {t["steps"]} steps of {t["batch_size"]} x {t["seq_len"]} tokens, AdamW, lr {t["peak_lr"]} (cosine to
  {t["min_lr"]}), seed {t["seed"]}, {t["threads"]} CPU thread: {r["train_seconds"]:.0f} s wall,
  {r["train_cpu_seconds"]:.0f} s of CPU.
- Loss (nats per token; uniform {r["uniform_loss"]:.2f}): training {r["train_loss"]:.3f}, held-out
  {r["held_out_loss"]:.3f} in float32, {r["held_out_loss_int4"]:.3f} with the weights llmexport stores (int4,
  block 64, asymmetric).
- Greedy, 16 tokens from the spec's prompt `{r["prompt"]}`: `{json.dumps(r["sample"])}`

Draft (Eagle3: one decoder layer over `[norm(embedding), norm(hidden)]`, `fc` over the target's three taps, its
own `lm_head` over a draft vocabulary):

- intermediate {d["intermediate_size"]}, attention as the target's ({m["num_heads"]} / {m["num_kv_heads"]} heads,
  head_dim {m["head_dim"]}, no q/k norm, RoPE theta 10000: what llmexport builds), {dr["parameters"]} parameters.
- Draft vocabulary: the {d["draft_vocab_size"]} target tokens the target predicts most often on its training
  text (`d2t` maps them to target ids); they cover {dr["draft_vocab_coverage"]:.2%} of its predictions. Half the
  vocabulary, as Eagle3 drafts over a frequent subset (Qwen3's drafts: 32000 of 151936): the `lm_head` shrinks,
  `d2t` is a real mapping for the build to carry, and the tokens left out are ones the target rarely predicts.
- Self-distilled: {dt["sequences"]} greedy generations of the target ({dt["seq_len"]} tokens each, from
  {dt["prompt_min"]}-{dt["prompt_max"]}-token windows of the training documents; {dr["training_text_tokens"]}
  tokens), labels = the target's greedy next token, features = the target's tapped hidden states, both from the
  int4 weights MNN runs. Training-time test: every anchor unrolled {dt["ttt_depth"]} draft steps on the draft's own
  output hidden states (the engine's draft depth), step k weighted {dt["step_weight"]}^k. {dt["steps"]} steps of
  {dt["batch_size"]} sequences, AdamW, lr {dt["peak_lr"]} (cosine to {dt["min_lr"]}), seed {dt["seed"]}:
  {dr["train_seconds"]:.0f} s wall, {dr["train_cpu_seconds"]:.0f} s of CPU. Final loss {dr["final_loss"]:.3f}; top-1
  agreement with the target per unrolled step {dr["final_top1_per_step"]} (training text, last
  {dt["log_every"]} steps).
- Acceptance on {len(r["eval_prompts"])} held-out prompts (the first {dt["prompt_words"]} words of held-out
  documents, {dt["eval_new_tokens"]} new tokens, greedy, chain of 3 drafts: MNN's defaults `eagle_topk` 1,
  `eagle_depth` 3, `draft_predict_length` 3): **{mnn["accepted_per_forward"]:.2f} tokens per target forward** in
  MNN's own engine (PyPI `MNN` `MNN.llm`, CPU, `"memory": "normal"`), speculative tokens identical to plain greedy
  decoding: {mnn["identical"]}; {sim["accepted_per_forward"]:.2f} simulated in torch with the same weights.
  `models/export/check_eagle.py` measures it again (`benchmarks/results/eagle_acceptance.json`).

Files: `config.json` (`speculative_type` `eagle`, `hidden_states` true), `llm_config.json`, `llm.mnn` +
`.weight` (outputs `logits` and `hidden_states` [1, seq, 3 x {m["hidden_size"]}]), `tokenizer.mtok`, `eagle.mnn` +
`.weight` (the draft), `eagle_fc.mnn` + `.weight`, `eagle_d2t.mnn`; {sizes}. `{train_model.TRAINING_FILE}` holds
the settings, loss histories, acceptance, versions and each file's sha256; `{train_model.WORDS_FILE}` every word of
the training text.

Made by `models/export/train_eagle.py` (needs the `export` extra with torch {train_model.TORCH_VERSION}; never in
CI). For measuring speculative decoding; it is not a useful language model.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=make_models.REPO_ROOT / TARGET.dest, help="model dir to write")
    parser.add_argument("--steps", type=int, default=train_model.Training.steps, help="target training steps")
    parser.add_argument("--draft-steps", type=int, default=DraftTraining.steps, help="draft training steps")
    parser.add_argument("--draft-sequences", type=int, default=DraftTraining.sequences, help="draft training texts")
    parser.add_argument(
        "--ttt-depth", type=int, default=DraftTraining.ttt_depth, help="draft steps unrolled in training (1: none)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (intra and inter op)")
    parser.add_argument("--random", type=Path, metavar="DIR", help="write a random-weight pair to DIR instead")
    parser.add_argument(
        "--qwen3-1.7b-layers",
        dest="qwen3_layers",
        type=int,
        metavar="N",
        help="with --random: a Qwen3-1.7B-shaped target of N layers (7..28) and a draft of Qwen3-1.7B-Eagle3's sizes",
    )
    args = make_models.parse_export_args(parser, argv)
    if args.qwen3_layers is not None and (args.random is None or not 7 <= args.qwen3_layers <= 28):
        parser.error("--qwen3-1.7b-layers: needs --random DIR and 7..28 layers (three distinct Eagle3 taps)")
    if args.random is not None:
        build_random(args.random.resolve(), make_models.DEFAULT_SEED, args.keep_tmp, not args.no_verify,
                     args.qwen3_layers)  # fmt: skip
        return 0
    target_cfg = train_model.Training(steps=args.steps, threads=args.threads)
    draft_cfg = DraftTraining(
        steps=args.draft_steps, sequences=args.draft_sequences, ttt_depth=args.ttt_depth, threads=args.threads
    )
    build(target_cfg, draft_cfg, DraftSpec(), args.out.resolve(), args.keep_tmp, not args.no_verify)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
