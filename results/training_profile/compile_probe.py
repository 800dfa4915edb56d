"""The throughput example's new step (fresh 2-layer drafter, draft vocabulary 8,192, bf16 autocast, fused AdamW), eager
against the drafter under `torch.compile` (the loss and AdamW stay eager), in one process.

- `static ATTENTION`: one row (store row 1,003) with 512 anchors, `dynamic=False`, 8 steps a measurement, alternating;
- `dynamic local`: 256 anchors on rows 1,000-1,015, `dynamic=True`; rows 1,000-1,003 warm the compiled drafter up.

    OMP_NUM_THREADS=1 python results/training_profile/compile_probe.py STORE static local|dense
    OMP_NUM_THREADS=1 python results/training_profile/compile_probe.py STORE dynamic local
"""
import sys
import time

import torch
import torch._dynamo

from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import load_target
from dflash_retrace.training.data import label_counts
from dflash_retrace.training.features import FeatureStore, StoredRows
from dflash_retrace.training.objective import dflash_block_loss, draft_vocabulary, sample_anchors

store_path, mode, attention = sys.argv[1:4]
torch.manual_seed(0)
store = FeatureStore(store_path)
rows = StoredRows(store)
target, _ = load_target("smollm2-135m-instruct", "cpu", "float32")
target.requires_grad_(False)
drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=8,
                                    target_layer_ids=store.layer_ids).float().train()
drafter.set_draft_vocabulary(draft_vocabulary(
    label_counts([rows[i] for i in range(200)], target.config.vocab_size, "target"), 8192))
opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4, fused=True)
compiled = torch.compile(drafter, dynamic=mode == "dynamic")


def step(model, i, max_anchors):
    row = store[i]
    anchors = sample_anchors(row.loss_mask, max_anchors, generator=torch.Generator().manual_seed(i))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = dflash_block_loss(model, target, row.input_ids, row.loss_mask, anchors,
                                        features=row.features[None], label_ids=row.labels, attention=attention)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return int(stats["counted"].sum())


if mode == "static":
    step(drafter, 1003, 512)
    t = time.perf_counter()
    step(compiled, 1003, 512)
    print(f"first compiled step (compile included): {time.perf_counter() - t:.1f} s", flush=True)
    for name, model in [("eager", drafter), ("compiled", compiled), ("eager", drafter), ("compiled", compiled)]:
        t = time.perf_counter()
        for _ in range(8):
            step(model, 1003, 512)
        print(f"{name}: {(time.perf_counter() - t) / 8 * 1e3:.0f} ms a step", flush=True)
else:
    for i in range(1000, 1004):
        t = time.perf_counter()
        step(compiled, i, 256)
        print(f"row {i} (T {store[i].input_ids.numel()}): first compiled call {time.perf_counter() - t:.1f} s", flush=True)
    for name, model in [("eager", drafter), ("compiled", compiled), ("eager", drafter), ("compiled", compiled)]:
        t = time.perf_counter()
        n = sum(step(model, i, 256) for i in range(1004, 1016))
        print(f"{name}: {n / (time.perf_counter() - t):.0f} slot-tokens/s", flush=True)
print("graph breaks", dict(torch._dynamo.utils.counters["graph_break"]), "graphs",
      torch._dynamo.utils.counters["stats"]["unique_graphs"])
