"""Greedy outputs of the shipped SmolLM2 drafters, for checking that a refactor changed nothing.

Loads SmolLM2-135M-Instruct (fp32) and each shipped drafter (`hub_configs/smollm2-135m-instruct-{dflash,retrace}`
of TREE), generates 48 tokens greedily for three fixed prompts, and writes the new token ids and acceptance lengths
to OUT.json. Run it on two trees and compare the files byte for byte:

    PYTHONPATH=<tree>/src OMP_NUM_THREADS=1 python examples/shipped_greedy_outputs.py <tree> out.json
"""

import json
import sys
from pathlib import Path

import torch

import dflash_retrace
from dflash_retrace import DFlashDrafter
from dflash_retrace.assets import resolve_model  # only names that exist in the old and the new layout

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Name three planets of the solar system and one fact about each.",
           "If a train travels 60 km in 45 minutes, what is its speed in km/h?"]


def main(tree: Path, out: str) -> None:
    here = Path(dflash_retrace.__file__).resolve()
    assert here.is_relative_to(tree.resolve()), f"dflash_retrace is imported from {here}, not from {tree}"
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model("smollm2-135m-instruct")
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    result = {}
    for name in ("dflash", "retrace"):
        drafter_dir = tree / "hub_configs" / f"smollm2-135m-instruct-{name}"
        drafter = DFlashDrafter.from_pretrained(drafter_dir, dtype=torch.float32).eval()
        result[name] = []
        for prompt in PROMPTS:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
            with torch.no_grad():
                output = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                                         do_sample=False, assistant_model=drafter)
            result[name].append({"ids": output[0, ids.shape[1]:].tolist(),
                                 "acceptance_lengths": drafter.last_stats.acceptance_lengths})
        print(name, [len(r["ids"]) for r in result[name]])
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
