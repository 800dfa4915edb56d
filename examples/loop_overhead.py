"""Where a speculative round's time goes, per loop: ours (`generate(assistant_model=drafter)`), z-lab's
`dflash_generate` and transformers' built-in `speculation_type="dflash"`, with the same target and drafter weights.

Each round is split into the target's forward, the drafter's forward, the rest of the candidate generator (ours
only) and the rest of the loop (verification, cache cropping, bookkeeping), timed by wrapping the two forwards, in
one process with the methods interleaved prompt by prompt (these machines are noisy). With the default tiny random
models the forwards cost about as much as the Python around them, so the split shows each loop's fixed cost per
round, the part that `bench --baselines` sees grow in importance as the hardware gets faster (bf16 on AMX, GPUs).
With `--target`/`--drafter` it times real models instead.

    python examples/loop_overhead.py --output results/loop_overhead_tiny.json
    python examples/loop_overhead.py --target smollm2-135m-instruct --drafter DIR --dtype float32 --prompts 8
"""

import argparse
import functools
import json
import time
import warnings

import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.evaluation.methods import BUILTIN, REFERENCE, SPECULATIVE, Methods
from dflash_retrace.generation_dflash import DFlashCandidateGenerator
from dflash_retrace.runtime import environment, load_drafter, load_target

PARTS = ("target_forward", "drafter_forward", "generator_rest", "loop_rest")


def tiny_models(hidden: int, target_layers: int, drafter_layers: int, block_size: int, vocab: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    heads = max(hidden // 16, 2)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=target_layers, num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                         head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None,
                         bos_token_id=1, pad_token_id=0)
    target = Qwen3ForCausalLM(config).eval()
    target.generation_config.eos_token_id = None  # every prompt runs its whole budget
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=drafter_layers, block_size=block_size).eval()
    return target, drafter


class Clock:
    """Accumulates the time spent in wrapped callables, by name."""

    def __init__(self):
        self.seconds = {}

    def wrap(self, owner, attribute: str, name: str) -> None:
        function = getattr(owner, attribute)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(owner, attribute, timed)

    def take(self) -> dict:
        seconds, self.seconds = self.seconds, {}
        return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a real target (default: a tiny random Qwen3)")
    parser.add_argument("--drafter", help="with --target: the drafter folder")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hidden", type=int, default=64, help="tiny models' width")
    parser.add_argument("--target-layers", type=int, default=4)
    parser.add_argument("--drafter-layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="loop_overhead.json")
    args = parser.parse_args(argv)
    if bool(args.target) != bool(args.drafter):
        parser.error("--target and --drafter go together (without both, tiny random models are used)")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)

    if args.target:
        target, _ = load_target(args.target, "cpu", args.dtype, inference=True)
        drafter = load_drafter(args.drafter, target, 0).to(target.device, target.dtype)
    else:
        target, drafter = tiny_models(args.hidden, args.target_layers, args.drafter_layers, args.block_size, 512,
                                      args.seed)
        target, drafter = target.to(getattr(torch, args.dtype)), drafter.to(getattr(torch, args.dtype))
    methods = Methods(target, drafter, args.max_new_tokens, temperature=0.0, baselines=True)
    names = [SPECULATIVE, REFERENCE, BUILTIN]
    missing = [n for n in names if n not in methods.available]
    if missing:
        raise SystemExit(f"cannot time {missing}: {methods.skipped}")

    clock = Clock()
    clock.wrap(target, "forward", "target_forward")
    clock.wrap(drafter, "forward", "drafter_forward")
    clock.wrap(methods.reference, "forward", "drafter_forward")
    clock.wrap(DFlashCandidateGenerator, "get_candidates", "generator")
    vocab = target.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, vocab, (1, args.prompt_length), generator=g) for _ in range(args.prompts + 1)]
    totals = {n: {"seconds": 0.0, "rounds": 0, **{p: 0.0 for p in PARTS}} for n in names}
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            for name in names:
                clock.take()
                start = time.perf_counter()
                result = methods.available[name](prompt, args.max_new_tokens)
                elapsed = time.perf_counter() - start
                parts = clock.take()
                if i == 0:  # warm-up
                    continue
                row = totals[name]
                row["seconds"] += elapsed
                row["rounds"] += len(result.acceptance_lengths)
                row["target_forward"] += parts.get("target_forward", 0.0)
                row["drafter_forward"] += parts.get("drafter_forward", 0.0)
                generator = parts.get("generator", 0.0)
                row["generator_rest"] += max(generator - parts.get("drafter_forward", 0.0), 0.0) if generator else 0.0
                row["loop_rest"] += elapsed - parts.get("target_forward", 0.0) - (
                    generator if generator else parts.get("drafter_forward", 0.0))

    report = {"environment": environment(target.device, target.dtype, args.seed), "args": vars(args), "methods": {}}
    header = f"{'method':22s} {'rounds':>6s} {'ms/round':>9s} " + " ".join(f"{p:>16s}" for p in PARTS)
    print(header)
    print("-" * len(header))
    for name in names:
        row = totals[name]
        per_round = {p: 1000 * row[p] / row["rounds"] for p in PARTS}
        ms = 1000 * row["seconds"] / row["rounds"]
        report["methods"][name] = {"rounds": row["rounds"], "seconds": row["seconds"], "ms_per_round": ms,
                                   "ms_per_round_by_part": per_round}
        print(f"{name:22s} {row['rounds']:6d} {ms:9.3f} " + " ".join(f"{per_round[p]:16.3f}" for p in PARTS))
    ours = report["methods"][SPECULATIVE]["ms_per_round"]
    for other in (REFERENCE, BUILTIN):
        ratio = ours / report["methods"][other]["ms_per_round"]
        report[f"ratio_per_round_vs_{other}"] = ratio
        print(f"per round, ours / {other}: {ratio:.3f}")
    with open(args.output, "w") as f:
        json.dump(report, f, indent=1)
    print(f"JSON: {args.output}")
    return report


if __name__ == "__main__":
    main()
