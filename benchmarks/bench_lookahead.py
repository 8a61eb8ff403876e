"""Lookahead speculation on the CPU: MNN's engine against the runtime's n-gram drafter, round by round.

For each prompt and lookahead setting, PyPI MNN's engine (``MNN.llm``, full precision, ``speculative_type =
"lookahead"``) generates ``--tokens`` greedy tokens; its rounds (tokens added per target forward) are read from where
it stops (`mnnbuild_runtime.speculative.engine_generate`: it checks the limit only between rounds). The runtime's loop
with `mnnbuild_runtime.lookahead.LookaheadDrafter` then generates as many tokens on the original model on the CPU.
The table gives both forward counts, the tokens per target forward, whether the rounds are the same, and whether
both gave the engine's plain greedy tokens. ``--tie-order insertion`` swaps the drafter's libstdc++ tie order for
insertion order, to show what that order decides.

Prompts: "Computes the" (2 tokens: nothing to copy) and, for each start, the start, the engine's 40 greedy tokens
after it, a blank line and the start again (a prompt the continuation can copy from).

Prints a table and writes ``benchmarks/results/lookahead.json`` (under the tie order's key). Not part of CI.

    python benchmarks/bench_lookahead.py [--model models/tiny-qwen3-trained] [--tokens 48] [--tie-order insertion]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, add_result, print_table  # noqa: E402
from mnnbuild_runtime import Embeddings, cpu_forward_fn  # noqa: E402
from mnnbuild_runtime.lookahead import LookaheadDrafter, LookaheadSettings, StdCounts  # noqa: E402
from mnnbuild_runtime.speculative import engine_generate, speculative_generate  # noqa: E402
from mnnbuild_runtime.tokenizer import Tokenizer  # noqa: E402

STARTS = ("Computes the", "Returns a new tensor with", "Applies a 2D convolution over")
SETTINGS = {
    "defaults": LookaheadSettings(),
    "ngram_update": LookaheadSettings(update=True),
    "ngram_update, high": LookaheadSettings(update=True, strictness="high"),
    "ngram_update, fcfs": LookaheadSettings(update=True, rule="fcfs"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=PROJECT_ROOT / "models" / "tiny-qwen3-trained")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--tie-order", choices=("libstdc++", "insertion"), default="libstdc++")
    args = parser.parse_args()
    config = args.model / "config.json"
    if args.tie_order == "insertion":
        StdCounts.items = lambda self: list(self.counts.items())  # type: ignore[method-assign]
    tokenizer, forward, embed = Tokenizer(config), cpu_forward_fn(args.model), Embeddings(args.model)
    prompts = {"Computes the": "Computes the"}
    for start in STARTS:
        plain = engine_generate(config, start, 40, speculative=False)
        prompts[f"{start} (copying)"] = start + tokenizer.decode(plain.tokens) + "\n\n" + start
    rows: list[list[Any]] = []
    runs = []
    for name, prompt in prompts.items():
        plain = engine_generate(config, prompt, args.tokens, speculative=False)
        for label, settings in SETTINGS.items():
            t0 = time.perf_counter()
            run = engine_generate(config, prompt, args.tokens, speculative=True,
                                  settings={"speculative_type": "lookahead", **settings.engine_config()})  # fmt: skip
            seconds = time.perf_counter() - t0
            assert run.rounds is not None
            drafter = LookaheadDrafter(args.model, settings=settings)
            spec = speculative_generate(forward, embed, drafter, run.prompt_ids, len(run.tokens) + 1, 128)
            ours = [r.tokens for r in spec.rounds[1:]]
            n = args.tokens  # the engine may run past it to a round's end
            same_tokens = run.tokens[:n] == plain.tokens == spec.result.tokens[:n]
            rows.append([name, label, len(run.prompt_ids), len(run.rounds), len(ours), run.mean_accepted or 0.0,
                         "yes" if ours == run.rounds else "NO", "yes" if same_tokens else "NO"])  # fmt: skip
            runs.append({"prompt": name, "settings": label, "prompt_ids": len(run.prompt_ids),
                         "tokens": len(run.tokens), "engine_rounds": run.rounds, "runtime_rounds": ours,
                         "engine_seconds": seconds,
                         "same_rounds": ours == run.rounds, "plain_tokens": same_tokens})  # fmt: skip
    print_table(["prompt", "settings", "prompt ids", "engine forwards", "runtime forwards", "tokens/forward",
                 "same rounds", "plain tokens"], rows)  # fmt: skip
    path = add_result("lookahead", args.tie_order, {"model": args.model.name, "tokens": args.tokens, "runs": runs})
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
