"""Supervised slot-tokens per second of a DFlash training step: the old path against the new one, same rows, one run.

- old: the target runs online (fp32) on every step, the loss is a full-vocabulary softmax, fp32, dense block mask,
  the LM head in chunks of 4,096 slots (what `train` did before the feature store);
- new: features and labels read from a feature store, a draft vocabulary, bf16 autocast, block-local attention,
  the LM head in chunks sized by `logits_chunk_size` (512 slots on the CPU for 8,192 rows), fused AdamW (as `train`).

Intermediate variants show where the gain comes from. Each step is forward + backward + AdamW on the same anchors;
the variants run in turn on each row (interleaved), after one warm-up row each. A slot-token is a supervised
(anchor, slot) pair: the same count for every variant.

    python examples/training_throughput.py --target smollm2-135m-instruct --features STORE --rows 12 \
        --output results/training_throughput.json
"""

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import environment, load_target
from dflash_retrace.training.data import label_counts
from dflash_retrace.training.features import FeatureStore, StoredRows
from dflash_retrace.training.objective import dflash_block_loss, draft_vocabulary, sample_anchors, target_features

OLD_CHUNK = 4096  # the LM-head chunk `train` used on every device before `logits_chunk_size`
VARIANTS = {  # name: (stored features, bf16 autocast, attention, draft vocabulary, LM-head chunk (None: the default),
    # fused AdamW)
    "old: online target, full vocab, fp32, dense": (False, False, "dense", False, OLD_CHUNK, False),
    "store, full vocab, fp32, dense": (True, False, "dense", False, OLD_CHUNK, False),
    "store, full vocab, bf16, dense": (True, True, "dense", False, OLD_CHUNK, False),
    "store, full vocab, bf16, local": (True, True, "local", False, OLD_CHUNK, False),
    "store, draft vocab, bf16, local": (True, True, "local", True, OLD_CHUNK, False),
    "store, draft vocab, bf16, local, small chunks": (True, True, "local", True, None, False),
    "new: store, draft vocab, bf16, local, small chunks, fused AdamW": (True, True, "local", True, None, True),
}


def step(drafter, optimizer, target, row, anchors, stored, bf16, attention, chunk):
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if stored:
            features, labels = row.features[None], row.labels
        else:
            features, labels = target_features(target, row.input_ids[None], drafter.config.target_layer_ids,
                                               with_labels=True)
            labels = labels[0]
        loss, stats = dflash_block_loss(drafter, target, row.input_ids, row.loss_mask, anchors, features=features,
                                        label_ids=labels, attention=attention, logits_chunk=chunk)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, int(stats["counted"].sum())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--features", required=True, help="a feature store of the target (`dflash-retrace features`)")
    p.add_argument("--rows", type=int, default=12, help="timed rows (after one warm-up row)")
    p.add_argument("--first-row", type=int, default=0, help="index of the first store row used")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--max-anchors", type=int, default=512)
    p.add_argument("--output", default="results/training_throughput.json")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    target, _ = load_target(args.target, "cpu", "float32")
    target.requires_grad_(False)
    store = FeatureStore(args.features)
    rows = StoredRows(store)
    base = DFlashDrafter.from_target(target, num_hidden_layers=args.num_layers, block_size=args.block_size,
                                     target_layer_ids=store.layer_ids).float().train()
    vocab = draft_vocabulary(label_counts([rows[i] for i in range(len(rows))], target.config.vocab_size, "target"),
                             args.draft_vocab_size)
    models = {}
    for name, (_, _, _, draft, _, fused) in VARIANTS.items():
        drafter = copy.deepcopy(base)
        if draft:
            drafter.set_draft_vocabulary(vocab)
        models[name] = (drafter, torch.optim.AdamW(drafter.parameters(), lr=1e-4, fused=fused))
    seconds = {n: 0.0 for n in VARIANTS}
    slots = {n: 0 for n in VARIANTS}
    for i in range(args.rows + 1):
        row = store[args.first_row + i]
        anchors = sample_anchors(row.loss_mask, args.max_anchors, generator=torch.Generator().manual_seed(i))
        for name, (stored, bf16, attention, _, chunk, _) in VARIANTS.items():
            drafter, optimizer = models[name]
            dt, n = step(drafter, optimizer, target, row, anchors, stored, bf16, attention, chunk)
            if i:  # row 0 warms up
                seconds[name] += dt
                slots[name] += n
        print(f"row {i}: " + ", ".join(f"{n.split(':')[0]} {slots[n] / max(seconds[n], 1e-9):.0f}/s" for n in VARIANTS),
              flush=True)
    old = next(iter(VARIANTS))
    table = {n: {"seconds": round(seconds[n], 3), "slot_tokens": slots[n],
                 "slot_tokens_per_s": round(slots[n] / seconds[n], 1),
                 "speedup_vs_old": round((slots[n] / seconds[n]) / (slots[old] / seconds[old]), 2)} for n in VARIANTS}
    report = {"config": vars(args), "threads": torch.get_num_threads(), "variants": table,
              "environment": environment(torch.device("cpu"), torch.bfloat16, 0)}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    for n, r in table.items():
        print(f"{n:45s} {r['slot_tokens_per_s']:9.1f} slot-tokens/s  {r['speedup_vs_old']:6.2f}x")


if __name__ == "__main__":
    main()
