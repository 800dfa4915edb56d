"""Write a training checkpoint (`OUT/checkpoints/step-N`, accelerate state) as a weights-only drafter folder, so that a
run stopped by a session's end travels in git and a later session on a fresh machine continues from its weights.

    python results/wip_run15/export_step.py run15/checkpoints/step-N --like run14_init --out results/wip_run15/weights

`--like` is a saved drafter of the same shape (its config is reused); the weights are saved in bfloat16, as
`train --save-dtype bfloat16` saves them.
"""

import argparse

import torch
from safetensors.torch import load_file

from dflash_retrace import DFlashDrafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", help="a checkpoints/step-N folder of `dflash-retrace train`")
    parser.add_argument("--like", required=True, help="a saved drafter folder with the same config")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    drafter = DFlashDrafter.from_pretrained(args.like)
    drafter.load_state_dict(load_file(f"{args.step}/model.safetensors"), strict=True)
    drafter.to(torch.bfloat16).save_pretrained(args.out)
    print(f"{args.step} -> {args.out}")


if __name__ == "__main__":
    main()
