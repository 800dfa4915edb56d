"""How much does the drafter use the target's hidden states? Teacher-forced per-slot accuracy on held-out answers
with the real context features against perturbed ones.

On the held-out split (data/smollm2-135m-instruct/held-out-ids.json; never trained on, no evaluation set), fp32,
labels = the target's own greedy chain (as training's `--labels target-chain`), every anchor of each answer:
- real:      the target's own states (what generation feeds the drafter);
- stale-k:   every context feature replaced by the one k positions earlier (the drafter still sees the
             same number of positions; the last k positions' states are hidden from it);
- other-row: the states of another held-out answer at the same positions (right length, wrong text);
- zero:      all context features zero (the block sees only its anchor token).
A drafter that reads the target's states loses accuracy under each; one that leans on token statistics does not.

    python results/feature_use/feature_use.py --drafter hub_configs/smollm2-135m-instruct-dflash \
        --rows heldout.jsonl --output results/feature_use/run8_heldout64.json
(heldout.jsonl: `gunzip -c data/smollm2-135m-instruct/regen-mix-part01.jsonl.gz | sed -n 577,640p`)
"""

import argparse
import json

import torch

from dflash_retrace.runtime import load_drafter, load_target
from dflash_retrace.training.data import tokenize_rows
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors, target_features, target_labels


def stale(features, k):
    out = torch.zeros_like(features)
    out[:, k:] = features[:, :-k]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--max-length", type=int, default=768)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    target, tokenizer = load_target(args.target, "cpu", "float32")
    drafter = load_drafter(args.drafter, target)
    B = drafter.config.block_size
    rows = [json.loads(line) for line in open(args.rows)]
    examples = tokenize_rows(rows, tokenizer, args.max_length, eos_token_id=target.generation_config.eos_token_id)
    computed = []
    for ex in examples:
        ids = ex.input_ids[None]
        feats, labels = target_features(target, ids, drafter.config.feature_layer_ids, with_labels=True)
        computed.append((ex, feats, labels[0]))
    conditions = ["real", "stale-1", "stale-2", "stale-4", "stale-16", "other-row", "zero"]
    totals = {c: [torch.zeros(B), torch.zeros(B), 0, 0] for c in conditions}
    for i, (ex, feats, labels) in enumerate(computed):
        anchors = sample_anchors(ex.loss_mask, 10**6)
        if anchors.numel() == 0:
            continue
        T = feats.shape[1]
        others = [f for (_, f, _) in computed if f.shape[1] >= T and f is not feats]
        other = others[i % len(others)][:, :T] if others else torch.zeros_like(feats)
        variants = {"real": feats, "stale-1": stale(feats, 1), "stale-2": stale(feats, 2), "stale-4": stale(feats, 4),
                    "stale-16": stale(feats, 16), "other-row": other, "zero": torch.zeros_like(feats)}
        for name, f in variants.items():
            _, stats = dflash_block_loss(drafter, target, ex.input_ids, ex.loss_mask, anchors, features=f,
                                         label_ids=labels, chain=True)
            t = totals[name]
            t[0] += stats["correct"].cpu()
            t[1] += stats["counted"].cpu()
            t[2] += int(stats["lead"])
            t[3] += int(stats["full_blocks"])
        print(f"row {i + 1}/{len(computed)}", flush=True)
    summary = {}
    for name, (correct, counted, lead, full) in totals.items():
        acc = (correct / counted.clamp_min(1))[1:]
        summary[name] = {"slot_accuracy": [round(float(a), 4) for a in acc], "blocks": int(counted[1]),
                         "tau_estimate": 1 + lead / full if full else None}
        print(f"{name:10s} tau~ {summary[name]['tau_estimate']:.3f}  slot accuracy "
              + " ".join(f"{a:.3f}" for a in acc))
    json.dump({"args": vars(args), "summary": summary}, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
