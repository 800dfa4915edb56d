"""Held-out metrics of drafters on a held-out feature store: the figures `train --eval-features` logs, for
drafters trained elsewhere (an earlier run, a shipped drafter), so every checkpoint is compared on the same rows.

    python examples/eval_held_out.py --target smollm2-135m-instruct --store heldout \
        --drafter run3=checkpoints/smollm2-135m-instruct-dflash-b8-wip --drafter run4=run4 --output held_out.json

Per drafter: the label loss, the per-slot accuracy and the teacher-forced τ estimate on the store's rows (random
anchors drawn with `HELD_OUT_SEED`, the same for every drafter and run), and τ with the real generator on the first
`--prompts` rows' prompts (greedy, `--max-new-tokens`; 0: none).
"""

from __future__ import annotations

import argparse
import json

import torch

from dflash_retrace.runtime import load_drafter, load_target
from dflash_retrace.training import TrainConfig
from dflash_retrace.training.features import FeatureStore, StoredRef
from dflash_retrace.training.held_out import held_out_metrics


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--store", required=True, help="held-out feature store (`dflash-retrace features`)")
    parser.add_argument("--drafter", action="append", required=True, help="NAME=FOLDER, repeatable")
    parser.add_argument("--dtype", default="float32", help="target dtype (default: float32)")
    parser.add_argument("--labels", default="target-chain", choices=["data", "target", "target-chain"])
    parser.add_argument("--max-anchors", type=int, default=256)
    parser.add_argument("--rows", type=int, help="only the store's first N rows (`train --eval-every` logs the first 32)")
    parser.add_argument("--prompts", type=int, default=8, help="rows whose prompts measure τ with the generator")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", help="JSON file")
    args = parser.parse_args(argv)
    target, _ = load_target(args.target, dtype=args.dtype)
    cfg = TrainConfig(features=args.store, labels=args.labels, max_anchors=args.max_anchors,
                      eval_prompts=args.prompts, eval_max_new_tokens=args.max_new_tokens).resolved()
    results = {}
    for spec in args.drafter:
        name, sep, folder = spec.partition("=")
        if not sep:
            parser.error(f"--drafter takes NAME=FOLDER, got {spec!r}")
        drafter = load_drafter(folder, target)
        store = FeatureStore(args.store).select_layers(drafter.config.feature_layer_ids)
        refs = [StoredRef(store, i) for i in range(min(len(store), args.rows or len(store)))]
        with torch.no_grad():
            metrics = held_out_metrics(drafter, target, refs, cfg, "local")
        results[name] = {"drafter": folder, **metrics}
        shown = {k: metrics[k] for k in ("held_out_loss", "held_out_tau_estimate", "held_out_tau")}
        print(name, json.dumps(shown), "slot accuracy", metrics["held_out_slot_accuracy"], flush=True)
    report = {"target": args.target, "store": args.store, "rows": len(FeatureStore(args.store)),
              "config": vars(args), "drafters": results}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
