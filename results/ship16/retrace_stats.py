"""What a ReTrace stage did: rounds of its rollouts that received memory, how far it moved the backbone, and the
norms of the weights it added (issue 13's shipping notes).

    python results/ship16/retrace_stats.py RETRACE_OUT INIT    # e.g. retrace16 checkpoints/smollm2-135m-instruct-dflash-b8-wip

RETRACE_OUT is `train --stage retrace`'s output folder (its `rollouts/` and `model.safetensors`), INIT the DFlash
drafter it started from. The backbone's move is ||W_after - W_before|| / ||W_before|| over the floating-point tensors
both hold (the draft vocabulary's integer index is left out).
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(out: str, init: str) -> None:
    rounds = with_memory = 0
    for path in sorted(Path(out, "rollouts").glob("*.pt")):
        rollout = torch.load(path, weights_only=True)
        rounds += len(rollout["acceptance_lengths"])
        with_memory += int((rollout["memory_index"] >= 0).sum())
    print(f"rollout rounds {rounds}, with memory {with_memory}")
    before, after = load_file(f"{init}/model.safetensors"), load_file(f"{out}/model.safetensors")
    shared = [k for k in before if k in after and before[k].is_floating_point()]
    moved = sum(float((after[k].float() - before[k].float()).pow(2).sum()) for k in shared) ** 0.5
    norm = sum(float(before[k].float().pow(2).sum()) for k in shared) ** 0.5
    print(f"backbone moved by {100 * moved / norm:.2f}% of its norm")
    for k in after:
        if k not in before:
            print(f"{k} {tuple(after[k].shape)} norm {float(after[k].float().norm()):.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
