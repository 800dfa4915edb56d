"""Grows a saved DFlash drafter folder by decoder layers that start as the identity (issue 13, run 25's depth A/B).

    python results/wip_run25/grow_layers.py DRAFTER OUT --layers 3

`dflash_retrace.training.init_layers.add_top_layers` (what `train --init DRAFTER --add-layers N` does before
training): each new layer goes on top as a copy of the top layer with its residual outputs (`o_proj`, `down_proj`)
zeroed. Saved only if the grown drafter computes what DRAFTER computes on a random block query (fp32).
"""

import argparse
import copy

import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training.init_layers import add_top_layers


@torch.no_grad()
def largest_difference(a: DFlashDrafter, b: DFlashDrafter, seed: int = 25) -> float:
    a, b = copy.deepcopy(a).float().eval(), copy.deepcopy(b).float().eval()
    g = torch.Generator().manual_seed(seed)
    H, T, q = a.config.hidden_size, 40, 2 * a.config.block_size
    feats = torch.randn(1, T, H * len(a.config.target_layer_ids), generator=g)
    noise = torch.randn(1, q, H, generator=g)
    pos = torch.arange(T + q)[None]
    out = [m(noise_embeds=noise, context_hidden_states=feats, position_ids=pos).last_hidden_state for m in (a, b)]
    return float((out[0] - out[1]).abs().max())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("drafter")
    p.add_argument("out")
    p.add_argument("--layers", type=int, required=True, help="layer count of the grown drafter")
    args = p.parse_args()
    drafter = DFlashDrafter.from_pretrained(args.drafter)
    grown = copy.deepcopy(drafter)
    add_top_layers(grown, args.layers - drafter.config.num_hidden_layers)
    diff = largest_difference(drafter, grown)
    if diff > 0:
        raise SystemExit(f"the grown drafter differs from {args.drafter} by {diff:.3g}: not saved")
    grown.save_pretrained(args.out)
    print(f"{args.out}: {args.layers} layers (from {drafter.config.num_hidden_layers}), the same function as "
          f"{args.drafter}")


if __name__ == "__main__":
    main()
