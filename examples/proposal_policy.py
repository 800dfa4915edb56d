"""Which proposal policy accepts more when the target samples: argmax (point-mass q) or sampled proposals?

Both are exact (transformers' rejection sampling with the q each returns); only acceptance differs. For each
prompt both policies run from the same seed, interleaved, in one process; prints and writes pooled τ.

    python examples/proposal_policy.py --drafter hub_configs/smollm2-135m-instruct-dflash --output results/proposal_policy.json
"""

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_retrace import DFlashDrafter
from dflash_retrace.assets import resolve_model
from dflash_retrace.prompts import load_prompts
from dflash_retrace.runtime import apply_chat_template


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--max-samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    path = resolve_model(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(args.drafter).eval()
    lengths = {"argmax": [], "sample": []}
    for i, item in enumerate(load_prompts(args.dataset, max_samples=args.max_samples, seed=args.seed)):
        text = apply_chat_template(tokenizer, [{"role": "user", "content": item["turns"][0]}])
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        for policy in lengths:
            drafter.config.proposal_policy = policy
            torch.manual_seed(args.seed + i)
            target.generate(**ids, assistant_model=drafter, do_sample=True, temperature=args.temperature, top_k=0,
                            top_p=1.0, max_new_tokens=args.max_new_tokens)
            lengths[policy] += drafter.last_stats.acceptance_lengths
    result = {k: {"tau_pooled": sum(v) / len(v), "rounds": len(v)} for k, v in lengths.items()}
    result["config"] = vars(args)
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
